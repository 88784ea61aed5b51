"""BibTeX of the papers behind sigprop and its init schemes (``sigprop cite``).  Which init
cites which paper is registry data (``InitScheme.cites``)."""

from __future__ import annotations

BIBTEX = {
    "arpit2019initialize": """@inproceedings{arpit2019initialize,
  title     = {How to Initialize your Network? Robust Initialization for {WeightNorm} \\& {ResNets}},
  author    = {Arpit, Devansh and Campos, V{\\'\\i}ctor and Bengio, Yoshua},
  booktitle = {Advances in Neural Information Processing Systems},
  volume    = {32},
  year      = {2019}
}""",
    "salimans2016weight": """@inproceedings{salimans2016weight,
  title     = {Weight Normalization: A Simple Reparameterization to Accelerate Training of Deep Neural Networks},
  author    = {Salimans, Tim and Kingma, Diederik P.},
  booktitle = {Advances in Neural Information Processing Systems},
  volume    = {29},
  year      = {2016}
}""",
    "de2020batch": """@inproceedings{de2020batch,
  title     = {Batch Normalization Biases Residual Blocks Towards the Identity Function in Deep Networks},
  author    = {De, Soham and Smith, Samuel L.},
  booktitle = {Advances in Neural Information Processing Systems},
  volume    = {33},
  year      = {2020}
}""",
    "he2015delving": """@inproceedings{he2015delving,
  title     = {Delving Deep into Rectifiers: Surpassing Human-Level Performance on {ImageNet} Classification},
  author    = {He, Kaiming and Zhang, Xiangyu and Ren, Shaoqing and Sun, Jian},
  booktitle = {Proceedings of the IEEE International Conference on Computer Vision (ICCV)},
  year      = {2015}
}""",
    "radford2019language": """@techreport{radford2019language,
  title       = {Language Models are Unsupervised Multitask Learners},
  author      = {Radford, Alec and Wu, Jeffrey and Child, Rewon and Luan, David and Amodei, Dario and Sutskever, Ilya},
  institution = {OpenAI},
  year        = {2019}
}""",
    "black2022gptneox": """@inproceedings{black2022gptneox,
  title     = {{GPT-NeoX-20B}: An Open-Source Autoregressive Language Model},
  author    = {Black, Sid and Biderman, Stella and Hallahan, Eric and others},
  booktitle = {Proceedings of BigScience Episode 5 -- Workshop on Challenges \\& Perspectives in Creating Large Language Models},
  year      = {2022}
}""",
    "nguyen2019transformers": """@inproceedings{nguyen2019transformers,
  title     = {Transformers without Tears: Improving the Normalization of Self-Attention},
  author    = {Nguyen, Toan Q. and Salazar, Julian},
  booktitle = {Proceedings of the 16th International Conference on Spoken Language Translation},
  year      = {2019}
}""",
    "hanin2018start": """@inproceedings{hanin2018start,
  title     = {How to Start Training: The Effect of Initialization and Architecture},
  author    = {Hanin, Boris and Rolnick, David},
  booktitle = {Advances in Neural Information Processing Systems},
  volume    = {31},
  year      = {2018}
}""",
    "paszke2019pytorch": """@inproceedings{paszke2019pytorch,
  title     = {{PyTorch}: An Imperative Style, High-Performance Deep Learning Library},
  author    = {Paszke, Adam and Gross, Sam and Massa, Francisco and Lerer, Adam and Bradbury, James and Chanan, Gregory and others},
  booktitle = {Advances in Neural Information Processing Systems},
  volume    = {32},
  year      = {2019}
}""",
    "xiao2018dynamical": """@inproceedings{xiao2018dynamical,
  title     = {Dynamical Isometry and a Mean Field Theory of {CNN}s: How to Train 10,000-Layer Vanilla Convolutional Neural Networks},
  author    = {Xiao, Lechao and Bahri, Yasaman and Sohl-Dickstein, Jascha and Schoenholz, Samuel S. and Pennington, Jeffrey},
  booktitle = {International Conference on Machine Learning},
  year      = {2018}
}""",
}

#: every probe rests on the WN theory of Arpit et al. 2019 and the WN reparameterization of Salimans & Kingma 2016
ALWAYS = ("arpit2019initialize", "salimans2016weight")


def keys_for(cites_by_init: dict[str, tuple[str, ...]], names: list[str] | None) -> list[str]:
    """The citation keys for these inits (all inits when ``names`` is None), in a stable order."""
    wanted = list(ALWAYS)
    for name, keys in cites_by_init.items():
        if names is None or name in names:
            wanted += [k for k in keys if k not in wanted]
    return wanted
