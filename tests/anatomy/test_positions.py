"""Positions in intermediate text map back to the reference file."""

from autoport_cst.transform.cst.positions import PositionMap


def test_unchanged_text_maps_to_itself():
    assert PositionMap("a\nb\n", "a\nb\n").original_line(2).line == 2


def test_lines_after_an_insertion_map_to_their_original_line():
    original = "".join(f"line {i}\n" for i in range(1, 11))
    current = original.replace("line 3\n", "line 3\nadded a\nadded b\n")
    mapping = PositionMap(original, current)
    assert mapping.original_line(8).line == 6  # "line 6" moved down by two
    assert mapping.original_line(8).exact


def test_a_line_written_by_an_earlier_step_is_marked():
    original = "a\nb\nc\n"
    current = "a\nnew\nb\nc\n"
    mapped = PositionMap(original, current).original_line(2)
    assert (mapped.line, mapped.exact) == (1, False)
