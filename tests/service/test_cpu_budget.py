"""``service.cpu_budget``: the allowance is spent by CPU time and refills with wall
time at the given share (clocks given by the test, so nothing depends on timing)."""

from __future__ import annotations

from service.cpu_budget import CpuBudget


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_budget_refuses_once_spent_and_refills_with_time():
    wall, cpu = Clock(), Clock()
    budget = CpuBudget(0.05, wall=wall, cpu=cpu)  # 0.1 s of allowance to start with
    assert budget.allows()
    with budget.spending():
        cpu.now += 0.15
        wall.now += 0.2
    assert budget.spent == 0.15
    assert not budget.allows()  # 0.1 - 0.15 + 0.2 * 0.05 = -0.04
    wall.now += 0.7  # + 0.035: still short
    assert not budget.allows()
    wall.now += 0.2  # + 0.01: > 0
    assert budget.allows()
    wall.now += 1000.0  # refills to the burst cap only
    assert budget.allows() and budget.allowance == 0.05 * CpuBudget.BURST_S


def test_a_full_share_never_refuses():
    wall, cpu = Clock(), Clock()
    budget = CpuBudget(1.0, wall=wall, cpu=cpu)
    with budget.spending():
        cpu.now += 100.0
    assert budget.allows()
