"""The scenarios of ``make gpu-check`` (``bench/gpu_check.py``, issue 34).

- :mod:`report`: results, the table, the JSON file and the docs section (pure);
- :mod:`decide`: parsing and the pass/fail decisions (pure);
- :mod:`scenarios`: each scenario's run on a GPU machine (ft_launcher and the workers);
- ``workers/``: the scripts the launcher starts (torch with CUDA).
"""
