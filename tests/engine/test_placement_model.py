"""The project's placement cannot hold a value the model refuses: assignments are
validated (a refused one leaves it as it was), `derive` is the one way to a changed
copy, and both say which setting and which limit in one line."""
import pytest

from engine.errors import LayerflowError
from engine.project import MAX_PROCESSES, Placement, PlacementError, ProjectError


def test_derive_validates_and_names_the_field_and_the_limit():
    p = Placement()
    assert p.derive(dp=4, tp=2).world == 8 and p.world == 1  # a copy; the original is left alone
    with pytest.raises(PlacementError, match=r"^placement\.schedule: must be 'gpipe', '1f1b', 'interleaved1f1b', "
                                             r"'interleavedzb', 'zbv' or 'dualpipev', not 'nonsense'$") as exc:
        p.derive(schedule="nonsense")
    assert exc.value.field == "placement.schedule"
    with pytest.raises(PlacementError, match=rf"^placement\.dp: must be less than or equal to {MAX_PROCESSES}, "
                                             r"not 100000$"):
        p.derive(dp=100_000)
    with pytest.raises(PlacementError, match=r"^placement\.tp: pp x dp x tp = 1,048,576 processes; at most 65,536: "
                                             r"lower placement\.pp, dp or tp \(now 1 x 1024 x 1024\)$") as exc:
        p.derive(dp=1024).derive(tp=1024)
    assert exc.value.field == "placement.tp"
    with pytest.raises(PlacementError, match=r"^placement dp=1024, tp=1024: pp x dp x tp = 1,048,576"):
        p.derive(dp=1024, tp=1024)
    with pytest.raises(PlacementError, match=r"^placement\.world_size: extra inputs are not permitted$"):
        p.derive(world_size=4)
    assert p.derive(microbatches=4).derive(microbatches=None).microbatches is None  # None: the planner picks


def test_the_error_is_one_line_the_cli_prints():
    with pytest.raises(PlacementError) as exc:
        Placement().derive(pp=0)
    assert isinstance(exc.value, ProjectError) and isinstance(exc.value, LayerflowError)
    assert isinstance(exc.value, ValueError) and "\n" not in str(exc.value)


def test_an_assignment_is_validated_and_a_refused_one_changes_nothing():
    p = Placement(dp=1024)
    with pytest.raises(PlacementError, match=r"^placement\.tp: pp x dp x tp = 1,048,576 processes"):
        p.tp = 1024  # each field is within its bounds: the model's check on the whole refuses it
    assert p.tp == 1 and p.world == 1024
    with pytest.raises(PlacementError, match=r"^placement\.schedule: "):
        p.schedule = "nonsense"
    assert p.schedule == "1f1b"
    p.tp, p.data_parallel = 2, "fsdp"
    assert (p.world, p.data_parallel) == (2048, "fsdp")


def test_model_copy_with_update_validates_too():
    """pydantic's model_copy(update=) skips validation; the placement's goes through derive."""
    with pytest.raises(PlacementError, match=r"placement\.schedule"):
        Placement().model_copy(update={"schedule": "nonsense"})
    assert Placement().model_copy(update={"pp": 2}).pp == 2
    assert Placement(tp=2).model_copy() == Placement(tp=2)


def test_bounds_and_choices_come_from_the_fields():
    assert Placement.bounds("pp") == (1, MAX_PROCESSES) and Placement.bounds("microbatches") == (1, MAX_PROCESSES)
    assert Placement.choices("schedule") == ("gpipe", "1f1b", "interleaved1f1b", "interleavedzb", "zbv", "dualpipev")
    assert Placement.choices("data_parallel") == ("ddp", "fsdp")


def test_the_planner_takes_the_typed_placement():
    from pathlib import Path

    from engine.planning.planner import make_plan
    from engine.project import load_project

    p = load_project(Path(__file__).resolve().parents[2] / "resources" / "examples" / "mlp_digits.lflow")
    typed = make_plan(p, 2, placement=p.placement.derive(pp=2, microbatches=2))
    assert typed.ok and (typed.run.pp, typed.run.microbatches, typed.world) == (2, 2, 2)
    assert typed.doc == make_plan(p, 2, placement={"pp": 2, "microbatches": 2}).doc  # the older dict form: the same
    assert p.placement.pp == 1  # the project's own is left alone
    p.placement = p.placement.derive(dp=2)
    assert make_plan(p).nproc == 2  # default: the project's placement, on its world
    with pytest.raises(PlacementError, match=r"^placement\.schedule: "):
        make_plan(p, 2, placement={"schedule": "nonsense"})  # a dict is validated as derive does
