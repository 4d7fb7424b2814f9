"""The ``labkit`` command: run the course headlessly, list its notebooks, check the machine.

Introduced in notebooks/00_setup_and_launcher.ipynb.

    labkit course run --fast                          # every notebook, small sizes
    labkit course run --only 00,03 --world-size 2 --backend gloo --output /tmp/course
    labkit course list                                # notebooks and their parameters
    labkit doctor                                     # environment preflight
    labkit bench --collective all_reduce --world-size 4 --sizes 8 1K 1M 16M
    labkit version

Heavy imports (papermill, torch) happen inside the subcommands, so ``labkit --help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

_EPILOG = """\
examples:
  labkit course run --fast                 run every notebook with fast=True
  labkit course run --only 00,03           run notebooks 00 and 03 only
  labkit course run --world-size 2 --backend gloo --output /tmp/course
  labkit course run --device cuda --backend nccl --world-size 2 --param seed=3
  labkit course list                       show the notebooks and their parameters
  labkit course translate --lang zh-CN     write notebooks/zh-CN/ from its catalogues
  labkit course run --fast --lang zh-CN    run the course in Chinese
  labkit doctor                            check Python, torch, backends and ports
  labkit bench --world-size 4 --sizes 1K 1M time all_reduce: time, algbw, busbw per size

exit status: 0 when everything passed, 1 when a notebook (or check) failed, 2 on usage errors.
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _selectors(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``labkit`` command (all subcommands).

    Returns:
        The parser; each subcommand's namespace carries its handler in ``func``.
    """
    from labkit import __version__
    from labkit.course.run import DEFAULT_CELL_TIMEOUT_S, DEFAULT_IDLE_TIMEOUT_S, DEFAULT_OUTPUT_DIR

    parser = argparse.ArgumentParser(
        prog="labkit",
        description="Lab kit of a hands-on course on distributed training with PyTorch.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"labkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    course = sub.add_parser(
        "course",
        help="run or list the course notebooks headlessly (papermill)",
        description="Run or list the course notebooks (notebooks/NN_*.ipynb) headlessly.",
    )
    course.set_defaults(func=lambda args: _usage(course))
    course_sub = course.add_subparsers(dest="course_command", metavar="SUBCOMMAND")

    run = course_sub.add_parser(
        "run",
        help="execute the notebooks in order and write a report",
        description=(
            "Execute the course notebooks in order with papermill, keep going past failures, "
            "and write the executed notebooks, report.html and summary.json to the output "
            "folder. Each notebook receives only the parameters it declares."
        ),
    )
    run.add_argument("--fast", action="store_true", help="pass fast=True (small sizes, seconds)")
    run.add_argument(
        "--only",
        type=_selectors,
        metavar="NN,NN",
        help="comma-separated notebook numbers or names, e.g. 00,03",
    )
    run.add_argument("--world-size", type=_positive_int, metavar="N", help="ranks to launch")
    run.add_argument("--backend", metavar="B", help='process-group backend, e.g. "gloo", "nccl"')
    run.add_argument(
        "--device",
        metavar="D",
        help="auto, cpu or cuda (rank r on GPU r; refused when no CUDA GPU is visible)",
    )
    run.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another parameter, repeatable; VALUE is a Python literal if it parses as one "
        "(--param seed=3), else a string",
    )
    run.add_argument(
        "--output",
        default=DEFAULT_OUTPUT_DIR,
        metavar="DIR",
        help=f"where executed notebooks and the report go (default: {DEFAULT_OUTPUT_DIR}/)",
    )
    run.add_argument("--notebooks", metavar="DIR", help="notebooks folder (default: the course's)")
    run.add_argument(
        "--cell-timeout",
        type=float,
        default=DEFAULT_CELL_TIMEOUT_S,
        metavar="S",
        help=f"seconds one cell may run before its notebook fails (default: "
        f"{DEFAULT_CELL_TIMEOUT_S:g})",
    )
    run.add_argument(
        "--idle-timeout",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT_S,
        metavar="S",
        help=f"seconds a cell may wait for its reply from an idle kernel (a lost message) before "
        f"its notebook fails; 0: no limit (default: {DEFAULT_IDLE_TIMEOUT_S:g})",
    )
    run.add_argument("--no-progress", action="store_true", help="hide the per-cell progress bar")
    run.add_argument(
        "--lang",
        metavar="LANG",
        help="run the course in a translation, e.g. zh-CN (notebooks/zh-CN/, feedback in it)",
    )
    run.set_defaults(func=_course_run)

    translate = course_sub.add_parser(
        "translate",
        help="write a translation of the notebooks from their catalogues (notebooks/i18n/)",
        description=(
            "Write notebooks/LANG/ from the English notebooks and the catalogues in "
            "notebooks/i18n/LANG/ (translated markdown; code cells copied). Refuses, listing "
            "each cell, when a translation is missing or stale."
        ),
    )
    translate.add_argument("--lang", required=True, metavar="LANG", help="e.g. zh-CN")
    translate.add_argument(
        "--check", action="store_true", help="only list missing or stale translations"
    )
    translate.add_argument("--notebooks", metavar="DIR", help="notebooks folder")
    translate.set_defaults(func=_course_translate)

    listing = course_sub.add_parser(
        "list",
        help="show the notebooks and the parameters each declares",
        description="List the course notebooks and their papermill parameters.",
    )
    listing.add_argument(
        "--notebooks", metavar="DIR", help="notebooks folder (default: the course's)"
    )
    listing.set_defaults(func=_course_list)

    doctor = sub.add_parser(
        "doctor",
        help="check this machine before a course or workshop",
        description="Environment preflight; arguments after 'doctor' go to it unchanged.",
        add_help=False,
    )
    doctor.set_defaults(func=lambda args: _doctor([]))  # main() hands it its own arguments

    _add_bench_parser(sub)
    version = sub.add_parser("version", help="print the labkit version")
    version.set_defaults(func=_version)
    parser.set_defaults(func=lambda args: _usage(parser))
    return parser


def _size(text: str) -> int:
    """``"8"``, ``"1K"``, ``"16M"``, ``"1G"`` (binary multiples) → bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    scale = units.get(text[-1:], 1)
    try:
        value = int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8, 1K, 16M)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"sizes must be at least 1 byte, got {text!r}")
    return value


def _add_bench_parser(sub) -> None:
    bench = sub.add_parser(
        "bench",
        help="time a collective (or p2p) on N ranks: time, algbw, busbw, like nccl-tests",
        description=(
            "Launch N ranks and time one collective per message size, printing the time, "
            "algbw and busbw (nccl-tests' definitions). Sizes follow nccl-tests: the whole "
            "buffer (all_gather: the gathered output)."
        ),
    )
    bench.add_argument("--backend", default="auto", metavar="B", help='e.g. "gloo", "labkit_shm"')
    bench.add_argument("--world-size", type=_positive_int, default=2, metavar="N")
    bench.add_argument(
        "--collective",
        default="all_reduce",
        metavar="NAME",
        help="all_reduce (default), all_gather, reduce_scatter, broadcast, all_to_all, p2p",
    )
    bench.add_argument(
        "--sizes", type=_size, nargs="+", metavar="SIZE", help="bytes, e.g. 8 1K 1M 16M"
    )
    bench.add_argument("--fast", action="store_true", help="a few small sizes only")
    bench.add_argument("--iters", type=_positive_int, default=20, help="timed calls per size")
    bench.add_argument("--warmup", type=int, default=3, help="untimed calls per size")
    bench.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    from labkit.bench import collective_sizes, format_table, launch_collective

    sizes = args.sizes or collective_sizes(fast=args.fast)
    try:
        rows = launch_collective(
            args.collective,
            sizes,
            world_size=args.world_size,
            backend=args.backend,
            iters=args.iters,
            warmup=args.warmup,
        )
    except ValueError as exc:
        print(f"labkit: error: {exc}", file=sys.stderr)
        return 2
    r0 = rows[0]
    print(f"# {args.collective} on {r0.world_size} ranks, backend {r0.backend}, {r0.device}")
    print(format_table(rows))
    return 0


def _course_translate(args: argparse.Namespace) -> int:
    from labkit.course.translate import command

    return command(args.notebooks, args.lang, check=args.check)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _course_run(args: argparse.Namespace) -> int:
    from labkit.course import course_parameters, find_notebooks, run_course, select_notebooks

    notebooks_dir = args.notebooks
    try:  # every refusal happens here, before any notebook runs
        if args.lang:
            from labkit.course.translate import translated_dir

            notebooks_dir = translated_dir(args.notebooks, args.lang, args.only)
        notebooks = select_notebooks(find_notebooks(notebooks_dir), args.only)
        parameters = course_parameters(
            fast=args.fast,
            world_size=args.world_size,
            backend=args.backend,
            device=args.device,
            params=args.param,
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"labkit: error: {exc}", file=sys.stderr)
        return 2
    if not notebooks:
        print("labkit: error: no notebooks named NN_*.ipynb to run", file=sys.stderr)
        return 2
    if args.lang:  # the kernels inherit it: exercise feedback in the course's language
        import os

        os.environ["LABKIT_LANG"] = args.lang
    results = run_course(
        notebooks_dir,
        args.output,
        only=args.only,
        parameters=parameters,
        cell_timeout=args.cell_timeout,
        idle_timeout=args.idle_timeout,
        progress_bar=not args.no_progress,
    )
    failed = [r for r in results if not r.ok]
    total_s = sum(r.seconds for r in results)
    print(f"{len(results) - len(failed)} of {len(results)} notebooks ok ({total_s:.1f} s)")
    if failed:
        print("failed: " + ", ".join(r.name for r in failed))
    print(f"report: {Path(args.output) / 'report.html'}")
    return 1 if failed else 0


def _course_list(args: argparse.Namespace) -> int:
    from labkit.course import declared_parameters, default_notebooks_dir, find_notebooks

    try:
        notebooks = find_notebooks(args.notebooks)
    except FileNotFoundError as exc:
        print(f"labkit: error: {exc}", file=sys.stderr)
        return 2
    folder = args.notebooks or default_notebooks_dir()
    if not notebooks:
        print(f"no notebooks named NN_*.ipynb in {folder}")
        return 0
    print(f"{len(notebooks)} notebooks in {folder}:")
    for path in notebooks:
        print(path.name)
        params = declared_parameters(path)
        if not params:
            print("    (no parameters cell)")
        for p in params.values():
            line = f"    {p['name']}: {p['inferred_type_name']} = {p['default']}"
            print(f"{line:<44}# {p['help']}" if p.get("help") else line)
    return 0


# Where the preflight lives: labkit.preflight (``lk.doctor`` is its function ``doctor``), or a
# labkit.doctor module; the first that exists and has ``main(argv) -> int`` runs.
DOCTOR_MODULES = ("labkit.preflight", "labkit.doctor")


def _doctor(doctor_args: list[str]) -> int:
    for name in DOCTOR_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise  # the module exists but one of its own imports is missing
            continue
        if callable(getattr(module, "main", None)):
            return int(module.main(doctor_args) or 0)
    print(
        "labkit doctor is not available in this checkout yet: none of "
        f"{', '.join(DOCTOR_MODULES)} provides main(argv).",
        file=sys.stderr,
    )
    return 2


def _version(args: argparse.Namespace) -> int:
    from labkit import __version__

    print(f"labkit {__version__} (python {sys.version.split()[0]})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``labkit`` console script.

    Args:
        argv: the arguments after ``labkit`` (None: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 ok, 1 a notebook or check failed, 2 usage error, 130 interrupted.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["doctor"]:  # its options (even --help) are the doctor's own
            return _doctor(argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except KeyboardInterrupt:
        print("labkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
