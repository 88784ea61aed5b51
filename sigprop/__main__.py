from sigprop.console import run

run()
