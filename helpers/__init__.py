"""Feed the GPU: the small, tested toolbox the notebooks import. The map, by purpose
(tests/test_helpers_map.py checks that it names every module, and nothing else):

data
  data            Fashion-MNIST and CIFAR-10 through torchvision; offline, a labelled stand-in
  synthetic       those stand-ins, written in the real data sets' on-disk formats
  pipelines       the CPU image pipeline: files on disk -> decode -> augment -> batch
  device_augment  batches of tensors held in memory or on the device; augmentation on the device
  dali_pipeline   NVIDIA DALI's decoding on the GPU, where it is installed
  data_wait       is the loop waiting for data? (the one input-bound rule)
  worker_memory   the memory DataLoader workers really take
  paths           where data sets and build output live on disk
models
  models          d2l's ResNet-18, written with eager layers, and a small CNN
  flops           FLOPs per training sample, and the fraction of a GPU's datasheet peak
training
  training        a plain training loop and evaluation, for notebooks not about the loop
  capstone        notebook 12's plumbing: data, model, recipes, timing a bar, the waterfall
  memory          the peak memory of a step (one measure, every device); saved activations
  checkpoints     checkpoints that load anywhere (the `module.` prefix, `map_location`)
timing
  timing          `Timer` and `benchmark`: warm-up, repeats, median, device synchronised
  threads         PyTorch's CPU threads, set from one place
  profiles        the smoke and full sizes of every notebook
  diagnose        a few steps under torch.profiler, and what bounds the loop
plotting
  plotting        a live training plot, bars labelled with ratios, a waterfall, one_at_a_time
devices
  devices         whichever accelerator there is (CUDA, MPS, XPU, else the CPU): sync, memory
distributed
  launch          worker processes started from a notebook, and always cleaned up
  process_group   the one worker set-up: backend, device, threads, init_process_group
  processes       children that die with their parent; ending a whole process tree
  ddp_train       notebook 10's DistributedDataParallel training script
  ddp_lessons     no_sync accumulation and sharding, in real processes
  model_split     notebook 09: a model split over two devices, and the GPipe schedule
everywhere
  checks          argument checks with one wording: `<where>: <name> must be ..., got ...`

helpers.suite: the machinery that runs the notebooks and writes the report (a notebook only
records into it: `from helpers.suite import results`)
  runner          `python -m helpers.suite`: every notebook headless, in order, then the report
  results         a notebook's measurements and claim verdicts, recorded as data
  claims          the claims, and the rule that turns measurements into each one's verdict
  catalog         notebooks/catalog.toml: the notebooks, their budgets, the claims each tests
  report          report.html and report.md from the recorded results
  setup_cell      the first cell of every notebook (Colab, Kaggle) and its badges
  lab             JupyterLab, started the way `make lab` starts it
"""

__version__ = "0.1.0"
