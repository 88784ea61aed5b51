from sigprop.cli import run

run()
