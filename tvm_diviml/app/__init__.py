"""The application layer: the user's MODEL, --platform and --cost turned into a problem, a plan, a
report, a build that runs here or across RPC servers. It sits above the library and ``passes``; only
``cli.py`` and ``bench/`` build on it.

  ``workload``      MODEL / --platform / --cost -> graph, platform, costs
  ``load``          a zoo name or model file -> the TVM model and its extraction
  ``report``        the contract row and the readable table of a solved plan
  ``dataparallel``  --batch-split: sub-batch copies of a zoo model, planned together and built
  ``run``           ``diviml run``: build, check and time a plan against every single device
  ``rpc_run``       ``diviml run --rpc``: one build per server, run across them
  ``coverage``      torchvision and Hugging Face models through the whole tool
"""
