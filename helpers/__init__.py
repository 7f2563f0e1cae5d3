"""Feed the GPU: the small, tested toolbox the notebooks import. The map, by purpose
(tests/test_helpers_map.py checks that it names every module, and nothing else):

data
  data            Fashion-MNIST and CIFAR-10 through torchvision (offline, a labelled stand-in);
                  `TensorBatches`: batches of uint8 tensors held in memory or on the device
                  `cifar_shaped`: the normalised images notebooks 12, 11 and 13 train on
  synthetic       those stand-ins, written in the real data sets' on-disk formats
  pipelines       the CPU image pipeline (image files, decode, augment), what its workers cost; DALI
  paths           where data sets and build output live on disk
models
  models          d2l's ResNet-18 with eager layers, a small CNN; FLOPs per training sample
                  and the fraction of a GPU's datasheet peak
training
  training        a plain training loop and evaluation, for notebooks not about the loop;
                  checkpoints that load anywhere; a step's peak memory (one measure, every
                  device) and saved activations
  capstone        notebook 19's plumbing: data, model, recipes, timing a bar, the waterfall
timing
  timing          `Timer` and `benchmark`: warm-up, repeats, median, device synchronised
  profiles        the smoke and full sizes of every notebook
  diagnose        where a loop's time goes (waiting for data, the device busy) and
                  `bottleneck`, the one classifier of what bounds it; `StepWindow`:
                  torch.profiler over a window of a running loop's steps
plotting
  plotting        bars labelled with ratios, a waterfall, one_at_a_time for explore callbacks
devices
  devices         whichever accelerator there is (CUDA, MPS, XPU, else the CPU): sync, memory,
                  what it can do (`capabilities`: bf16, compile, TF32, kernels in this build);
                  fp32 matmuls and convolutions as true fp32 or TF32 (`fp32_precision`);
                  the CPU's threads (`cpu_threads`, `share`), set from one place
distributed
  launch          N ranks of a notebook's script, meeting through a file; always cleaned up
  processes       children that die with their parent; ending a whole process tree
everywhere
  checks          argument checks with one wording: `<where>: <name> must be ..., got ...`

helpers.suite: the machinery that runs the notebooks and writes the report (a notebook only
records into it: `from helpers.suite import results`)
  runner          `python -m helpers.suite`: every notebook headless, in order, then the report
  runs            run folders (`build/runs/<time>/`, `build/latest`) and committed reference runs
  results         a notebook's measurements and claim verdicts, recorded as data
  claims          the claims, and the rule that turns measurements into each one's verdict
  catalog         notebooks/catalog.toml: the notebooks, their budgets, the claims each tests
  report          report.html and report.md from the recorded results
  setup_cell      the first cell of every notebook (Colab, Kaggle) and its badges
  lab             JupyterLab, started the way `make lab` starts it

helpers.doctor: the bottleneck doctor, a product of its own (`doctor.watch(loader)` in a notebook,
`python -m helpers.doctor script.py` in a shell): the suite's lessons applied to any training loop
  session         the engine: the first optimizer's steps, measured window after window
  counting        the dispatch-level counter: ops, syncs, the hot ops' dtypes
  profiled        reading the windows (torch.profiler, the counter) and this machine's rates
  copies          copies between host and device (CUDA), told apart from the profiler's events
  rules           findings ranked by share of step time; the verdict by `diagnose.bottleneck`
  watcher         the in-notebook form, `watch(loader)`, and its measured what-ifs
  text            the diagnosis in words
  cli             the shell form: a script run unmodified, stopped, and cleaned up
  whatif          --what-if: the script re-run with the top finding's setting changed
  memory          memory over time: the bytes held at each step's end, their slope, who made them
  compare         `compare BEFORE.json AFTER.json`: the step change against its noise band
"""

__version__ = "0.2.0"


def _warn_below_tested_versions() -> None:
    """Name, in one line, every installed package older than the version this suite is tested
    from (torch above all: a hosted notebook keeps its own), before an unrelated error (an API
    that version lacks) could say it less clearly. The bounds are this package's own metadata
    (pyproject.toml), the one place they live."""
    import warnings
    from importlib import metadata

    try:
        declared = metadata.requires("feed-the-gpu") or []
    except metadata.PackageNotFoundError:  # a bare checkout on sys.path
        return
    from packaging.requirements import Requirement  # a dependency: here once the suite is installed
    from packaging.version import Version

    requirements = [Requirement(r) for r in declared]
    older = []
    for req in requirements:
        floor = next((s.version for s in req.specifier if s.operator == ">="), None)
        if floor is None or req.marker is not None:  # an extra's requirement: not ours to judge
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:  # missing: pip (or the setup cell) installs it
            continue
        if Version(have).release < Version(floor).release:  # 2.11.0+cu130 counts as 2.11.0
            older.append((f"{req.name} {have} (tested from {floor})", f"'{req.name}>={floor}'"))
    if older:
        warnings.warn(
            f"Feed the GPU is tested on newer versions than this environment has: "
            f"{', '.join(o[0] for o in older)}; some notebooks may fail. Upgrade with: "
            f"pip install {' '.join(o[1] for o in older)}",
            stacklevel=2,
        )


_warn_below_tested_versions()
