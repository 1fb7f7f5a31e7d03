"""How a chat looks: a Rich live panel under the streaming answer on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import PurePath

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from speclite.engine.engine import Chunk, RequestOutput
from speclite.engine.stats import RequestStats, parts_summary

MAX_BARS = 8  # positions drawn as bars; the rest are summed up in one line
BAR_WIDTH = 30
REFRESH_S = 0.05  # a fast GPU verifies hundreds of iterations a second: redraw at most 20 times a second


@dataclass
class Setup:
    """What is running right now (k and on/off change during a session)."""

    method: str  # speculation method, or "off"
    k: str  # current k, e.g. "4" or "auto(3)"; "" when off
    target: str
    draft: str | None

    @classmethod
    def of(cls, llm) -> "Setup":
        dtype = str(llm.dtype).removeprefix("torch.")
        k = llm.k_label
        draft = None
        if llm.draft_name:
            draft = f"{_short(llm.draft_name)} [{llm.draft_quant_label or dtype}]"
        return cls(
            method=llm.spec_config.method if k is not None else "off",
            k=k or "",
            target=f"{_short(llm.model_name)} [{llm.quant_label or dtype}]",
            draft=draft,
        )

    @property
    def title(self) -> str:
        return f"{self.method} k={self.k}" if self.method != "off" else "plain decoding (speculation off)"

    @property
    def models(self) -> str:
        return f"target {self.target}" + (f" · draft {self.draft}" if self.draft else "")


def _short(name: str) -> str:
    """A directory or org/name as its last part: panels are 80 columns wide."""
    return PurePath(name).name or name


# -- the panel ---------------------------------------------------------------------------------


def _bar(frac: float) -> str:
    filled = round(frac * BAR_WIDTH)
    return "█" * filled + "░" * (BAR_WIDTH - filled)


def stats_panel(stats: RequestStats | None, setup: Setup, width: int = 80, title: str | None = None) -> Panel:
    """tokens/s, acceptance (overall and per draft position), draft vs verify time, k, models."""
    stats = stats or RequestStats(done_s=0.0)
    grid = Table.grid(padding=(0, 2))
    for justify in ("left", "right", "left", "right"):
        grid.add_column(justify=justify, no_wrap=True)
    speculating = stats.proposed > 0
    grid.add_row("tokens/s", f"{stats.tokens_per_s:.1f}", "tokens/iter", f"{stats.avg_tokens_per_iter:.2f}")
    grid.add_row("accept rate", f"{stats.accept_rate:.1%}" if speculating else "-",
                 "draft/verify", f"{stats.draft_s * 1000:.0f}/{stats.verify_s * 1000:.0f} ms")
    grid.add_row("tokens", f"{stats.output_len}", "iterations", f"{stats.iter_count}")
    parts = [Text(setup.models, overflow="ellipsis", no_wrap=True), grid]
    per_position = stats.accepted_per_position
    if per_position:
        parts.append(Text("accepted by draft position", style="dim"))
        for i, frac in enumerate(per_position[:MAX_BARS]):
            parts.append(Text(f"{i + 1:>2} {_bar(frac)} {frac:>4.0%}"))
        rest = per_position[MAX_BARS:]
        if rest:
            parts.append(Text(f"   positions {MAX_BARS + 1}-{len(per_position)}: mean {sum(rest) / len(rest):.0%}"))
    if stats.parts:
        parts.append(Text(f"accepted by part: {parts_summary(stats.parts)}", overflow="ellipsis", no_wrap=True))
    return Panel(Group(*parts), title=title or setup.title, title_align="left", width=width)


def stats_line(stats: RequestStats, setup: Setup) -> str:
    """The panel as one plain line (output that is not a terminal)."""
    parts = [f"[{setup.title}] {stats.output_len} tokens", f"{stats.tokens_per_s:.1f} tokens/s",
             f"{stats.avg_tokens_per_iter:.2f} tokens/iter"]
    if stats.proposed:
        by_position = " ".join(f"{x:.0%}" for x in stats.accepted_per_position)
        parts += [f"accept rate {stats.accept_rate:.1%}", f"by position {by_position}"]
    if stats.parts:
        parts.append(f"by part {parts_summary(stats.parts)}")
    parts.append(f"draft/verify {stats.draft_s * 1000:.0f}/{stats.verify_s * 1000:.0f} ms")
    return ", ".join(parts)


# -- the two views -----------------------------------------------------------------------------


class LiveView:
    """The answer streams with the panel drawn under it; both stay in the scrollback afterwards."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False)
        self.live: Live | None = None

    @property
    def width(self) -> int:
        return min(self.console.width, 80)

    def info(self, text: str) -> None:
        self.console.print(Text(text, style="dim"))

    def error(self, text: str) -> None:
        self.console.print(Text(f"error: {text}", style="red"))

    def reply(self, text: str) -> None:
        self.console.print(Text(text))

    def totals(self, stats: RequestStats, setup: Setup, title: str) -> None:
        self.console.print(stats_panel(stats, setup, self.width, title=title))

    def start(self, setup: Setup) -> None:
        self.setup, self.text, self.stats, self.drawn, self.live = setup, "", None, 0.0, None
        # Transient: the cropped live frame is replaced by the whole answer when it ends.
        self.live = Live(_Frame(self), console=self.console, auto_refresh=False, transient=True)
        self.live.start(refresh=True)

    def update(self, chunk: Chunk) -> None:
        self.text += chunk.text
        self.stats = chunk.stats
        if time.perf_counter() - self.drawn >= REFRESH_S:
            self.live.refresh()
            self.drawn = time.perf_counter()

    def end(self, out: RequestOutput | None, interrupted: bool) -> None:
        if self.live is not None:  # None when Ctrl-C came before the live display started
            self.live.stop()
        self.console.print(Text(out.text if out else self.text))
        if interrupted:
            self.console.print(Text("[interrupted: the partial answer stays in the conversation]", style="yellow"))
        self.console.print(stats_panel(out.stats if out else self.stats, self.setup, self.width))


class _Frame:
    """The live frame: as much of the answer's tail as fits above the panel."""

    def __init__(self, view: LiveView):
        self.view = view

    def __rich_console__(self, console, options):
        view = self.view
        panel = console.render_lines(stats_panel(view.stats, view.setup, view.width), options, pad=False)
        room = max(1, console.size.height - len(panel) - 1)
        # Only the tail can show: wrap just enough of it (a long answer would be slow to re-wrap).
        tail = view.text[-room * (options.max_width + 1):]
        lines = console.render_lines(Text(tail), options, pad=False)[-room:]
        for line in lines + panel:
            yield from line
            yield Segment.line()


class PlainView:
    """Output that is not a terminal: the answer as it streams, then one line of figures."""

    def info(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def error(self, text: str) -> None:
        print(f"error: {text}", file=sys.stderr, flush=True)

    def reply(self, text: str) -> None:
        print(text, flush=True)

    def totals(self, stats: RequestStats, setup: Setup, title: str) -> None:
        print(f"{title}: {stats_line(stats, setup)}", flush=True)

    def start(self, setup: Setup) -> None:
        self.setup, self.stats = setup, None

    def update(self, chunk: Chunk) -> None:
        self.stats = chunk.stats
        sys.stdout.write(chunk.text)
        sys.stdout.flush()

    def end(self, out: RequestOutput | None, interrupted: bool) -> None:
        print("\n[interrupted]" if interrupted else "", flush=True)
        stats = out.stats if out else self.stats
        if stats is not None:
            print(stats_line(stats, self.setup), flush=True)
