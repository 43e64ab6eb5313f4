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


def test_a_line_an_earlier_step_re_indented_maps_to_the_line_it_was():
    """A step that wraps code in a block (dense-layers' ``if not dense:``)
    re-indents it: a line of it maps to the reference line with its text, its
    column dropped; a line no reference line reads like maps before it."""
    original = "a\nb\nx = 1\ny = 2\nc\n"
    current = "a\nb\nif ok:\n    x = 1\n    y = 2\nc\n"
    mapping = PositionMap(original, current)
    assert (mapping.original_line(5).line, mapping.original_line(5).exact) == (4, False)
    assert mapping.original_line(4).line == 3
    assert (mapping.original_line(3).line, mapping.original_line(3).exact) == (2, False)


def test_a_rewritten_line_read_twice_in_the_replaced_lines_is_not_guessed():
    original = "a\nx\nx\nc\n"
    current = "a\n  x\n  x\nc\n"
    assert PositionMap(original, current).original_line(3).line == 1
