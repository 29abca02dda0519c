"""Rules on when the rack grows (progressive.growth.schedule): the keys each schedule reads,
the budgets budget_share splits, and the evaluations a plateau needs."""

from __future__ import annotations

from collections.abc import Iterator

from stackwise.config.base import cross_rule
from stackwise.config.root import Config


@cross_rule
def growth_schedule(cfg: Config) -> Iterator[str]:
    """Each schedule's own keys, refused under another one."""
    p = cfg.progressive
    g = p.growth
    if p.strategy != "progressive":  # rules_progressive refuses the growth section then
        return
    if g.schedule != "budget_share" and g.shares is not None:
        yield (
            "progressive.growth.shares only applies to growth.schedule: budget_share; set "
            "that schedule or remove shares"
        )
    if g.schedule != "plateau":
        for name in ("patience", "min_delta"):
            if g.changed(name):
                yield (
                    f"progressive.growth.{name} only applies to growth.schedule: plateau; "
                    f"set that schedule or remove {name}"
                )
    if g.schedule == "budget_share":
        yield from _shares(cfg)
    elif g.schedule == "plateau":
        yield from _plateau(cfg)


def _own_budgets(cfg: Config) -> list[str]:
    """The keys that set a stage's budget themselves (per stack, or every stack's)."""
    p = cfg.progressive
    names = [f"progressive.{n}" for n in ("steps_per_stack", "epochs_per_stack") if p.changed(n)]
    for k, over in sorted(p.stacks.items()):
        names += [f"progressive.stacks.{k}.{n}" for n in ("steps", "epochs") if getattr(over, n)]
    return names


def _shares(cfg: Config) -> Iterator[str]:
    """budget_share: one weight per stack, and train.max_steps as the one budget."""
    shares, n = cfg.progressive.growth.shares, cfg.model.n_stacks
    if shares is not None and len(shares) != n:
        yield (
            f"progressive.growth.shares gives {len(shares)} weights for model.n_stacks={n}; "
            "give one weight per stack"
        )
    for name in _own_budgets(cfg):
        yield (
            f"growth.schedule budget_share splits train.max_steps over the stacks, and {name} "
            f"sets a stage's budget itself: keep budget_share and remove {name}, or keep "
            f"{name} with growth.schedule fixed"
        )
    steps = cfg.train.max_steps
    if cfg.train.num_train_epochs is None and steps < n:
        yield (
            f"growth.schedule budget_share cannot give each of the {n} stacks a step of "
            f"train.max_steps={steps}; raise train.max_steps"
        )


def _plateau(cfg: Config) -> Iterator[str]:
    """plateau: a rack that grows, and evaluations inside each stage that may end on one."""
    g, tc, n = cfg.progressive.growth, cfg.train, cfg.model.n_stacks
    if n == 1:
        yield (
            "growth.schedule plateau decides when the rack grows, and with model.n_stacks=1 "
            "it never grows; use growth.schedule fixed, or grow more stacks"
        )
    if tc.stopping_patience() is not None:
        yield (
            "train.early_stopping would end each stage without passing its unused steps on; "
            "growth.schedule plateau ends the stages on growth.patience and growth.min_delta, "
            "so remove train.early_stopping (and early_stopping_patience)"
        )
    need = g.patience * tc.eval_every
    short = [(k, b) for k, b in enumerate(_planned(cfg)[:-1]) if b is not None and b <= need]
    if short:
        k, steps = short[0]
        yield (
            f"growth.schedule plateau ends a stage after growth.patience={g.patience} "
            f"evaluations without improvement, one every train.eval_every={tc.eval_every} "
            f"steps, so a stage needs more than {need} steps, and stack {k} gets {steps}: "
            "lower eval_every or patience, or give the stages more steps"
        )


def _planned(cfg: Config) -> list[int | None]:
    """Each stage's planned steps where the config alone says (None: from epochs, which
    need the data's size; the run checks those before its first stage)."""
    p, n = cfg.progressive, cfg.model.n_stacks
    out: list[int | None] = []
    for k in range(n):
        over = p.stacks.get(k)
        if over and over.steps:
            out.append(over.steps)
        elif (over and over.epochs) or p.epochs_per_stack:
            out.append(None)
        elif p.steps_per_stack:
            out.append(p.steps_per_stack)
        else:
            steps = cfg.train.max_steps if cfg.train.num_train_epochs is None else None
            out.append(None if steps is None else max(1, steps // n))
    return out


@cross_rule
def growth_init_needs_growth(cfg: Config) -> Iterator[str]:
    """An operator starts stacks grown onto a trunk: a rack of one stack never has one."""
    g = cfg.progressive.growth
    if cfg.progressive.strategy != "progressive" or cfg.model.n_stacks > 1:
        return
    if cfg.model.init_from_hf:  # the imported trunk is there to copy
        return
    for name, default in (("init", "random"), ("noise", 0.0)):
        if getattr(g, name) != default:
            yield (
                f"progressive.growth.{name} sets how stacks grown onto a trunk start, and "
                "with model.n_stacks=1 none is; remove it, or grow more stacks"
            )
