"""bench/model_shapes.py's table: each file's row shows what its results hold, and the 16 prompts'
decode steps are set against our own batch 1, the figure counted the same way."""

from __future__ import annotations

from bench import model_shapes

PEER = {"decode_tok_s": 20.0, "prefill_tok_s": 100.0, "peak_rss_gb": 1.25, "load_s": 0.5}
OURS = {
    "decode_tok_s": 16.0,
    "prefill_tok_s": 80.0,
    "batch16_tok_s": 28.0,
    "peak_rss_gb": 2.0,
    "load_s": 8.0,
    "first_load_s": 9.0,
}


def _row(ours: dict) -> list[str]:
    table = model_shapes.table({"llama Q4_0": {"sgl_lite": ours, "llama_cpp": PEER}})
    row = table.splitlines()[2]
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_a_row_holds_each_figure_and_the_ratios_to_llama_cpp():
    cells = _row({**OURS, "batch16_decode_tok_s": 64.0})
    assert cells[:5] == ["llama Q4_0", "16.0 / 20.0", "0.80", "80 / 100", "0.80"]
    # end to end, then the decode steps alone and their ratio to our batch 1 (64 / 16)
    assert cells[5] == "28; 64 (4.0x)"
    assert cells[6:] == ["2.00 / 1.25", "8.0 / 0.5", "9.0"]


def test_results_from_before_the_decode_steps_were_measured_show_end_to_end_alone():
    assert _row(OURS)[5] == "28"


def test_a_skipped_file_says_why():
    table = model_shapes.table({"qwen3 Q4_0": {"sgl_lite": {"skipped": "file not made"}}})
    assert "| qwen3 Q4_0 | file not made |" in table
