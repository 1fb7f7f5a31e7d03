"""`speclite quantize`'s live view: a Rich bar on a terminal, plain lines when piped."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import (BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)

from speclite.quant.quantize import QuantProgress


class ConsoleProgress(QuantProgress):
    """Tensors done / total, MB/s of input and time left; `verbose` also lists every tensor."""

    def __init__(self, console: Console, verbose: bool = False):
        self.console, self.verbose = console, verbose
        self.bar: Progress | None = None
        self.task = None
        self.out_dir: Path | None = None  # set once the checkpoint is complete

    def start(self, tensors: int, nbytes: int) -> None:
        if not self.console.is_terminal:
            self.console.print(f"quantizing {tensors} tensors ({nbytes / 1e6:.0f} MB)", markup=False, highlight=False)
            return
        self.bar = Progress(TextColumn("quantizing"), BarColumn(), TaskProgressColumn(),
                            TextColumn("{task.fields[done]}/{task.fields[tensors]} tensors"), TransferSpeedColumn(),
                            TimeRemainingColumn(), console=self.console, transient=True)
        # Advanced in bytes of input, which MB/s and the time left are computed from.
        self.task = self.bar.add_task("", total=nbytes, done=0, tensors=tensors)
        self.bar.start()

    def tensor(self, name: str, nbytes: int) -> None:
        if self.verbose:
            self.console.print(f"  {name}", markup=False, highlight=False)
        if self.bar is not None:
            done = self.bar.tasks[0].fields["done"] + 1
            self.bar.update(self.task, advance=nbytes, done=done)

    def note(self, message: str) -> None:
        # Printed above the live bar while there is one.
        self.console.print(message, markup=False, highlight=False)

    def written(self, out_dir: Path) -> None:
        self.out_dir = out_dir

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
