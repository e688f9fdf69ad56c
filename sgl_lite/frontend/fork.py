"""ProgramStateGroup: the states made by `s.fork(n)`, driven together and joined back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sgl_lite.frontend import ir
from sgl_lite.frontend.interpreter import ProgramState

_MISSING = object()


class ProgramStateGroup:
    """`forks += expr` adds to every fork; a list or `lambda i: ...` gives each its own."""

    def __init__(self, states: list[ProgramState], parent: ProgramState) -> None:
        self.states = states
        self.parent = parent
        self._base_vars = dict(parent._vars)
        self._base_len = len(parent._t.text)

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> ProgramStateGroup:
        if callable(other) and not isinstance(other, ir.Expr):
            for i, state in enumerate(self.states):
                state += other(i)
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(
                    f"adding a list of {len(other)} expressions to a fork of "
                    f"{len(self.states)}: give one per fork"
                )
            for state, expr in zip(self.states, other):
                state += expr
        else:
            for state in self.states:
                state += other
        return self

    def sync(self) -> None:
        for state in self.states:
            state.sync()

    def join(self, mode: str = "gather_variable") -> None:
        """Waits for every fork and brings results back into the parent.

        `gather_variable`: each variable the forks set becomes a list in the parent (meta info
        too). `concate_joined`: the forks' new text is appended to the parent's text.
        """
        if mode not in ("gather_variable", "concate_joined"):
            raise ValueError(f"join(mode={mode!r}): use 'gather_variable' or 'concate_joined'")
        for state in self.states:
            state.close()
            if state.error() is not None:
                raise state._program_error("a fork failed") from state._error
        if mode == "concate_joined":
            self.parent += "".join(s._t.text[self._base_len :] for s in self.states)
            return
        names: dict[str, None] = {}
        for state in self.states:
            for name, value in state._vars.items():
                if self._base_vars.get(name, _MISSING) is not value:
                    names[name] = None
        for name in names:
            self.parent.submit(
                ir.SetVar(
                    name=name,
                    value=[s._vars.get(name) for s in self.states],
                    meta_info=[s._meta.get(name) for s in self.states],
                )
            )
