"""The application layer: the user's MODEL, --platform and --cost turned into a problem, a plan, a
report, a build that runs here or across RPC servers. It sits above the library and ``passes``; only
``cli/`` and ``bench/`` build on it.

  ``workload``      MODEL / --platform / --cost -> graph, platform, costs
  ``load``          a zoo name, model file or model object -> the TVM model and its extraction
  ``job``           what plan, run and profile share: load and solve options, the solve and its row
  ``report``        the contract row and the readable table of a solved plan
  ``dataparallel``  --batch-split: sub-batch copies of a zoo model, planned together and built
  ``run``           ``diviml run``: build, check and time a plan against every single device
  ``rpc_run``       ``diviml run --rpc``: one build per server, run across them
  ``profile``       ``diviml profile``: every kernel timed, and how far to trust the figures
  ``coverage``      torchvision and Hugging Face models through the whole tool
"""
