"""``benchmarks/conversion_bench.py``'s comparison of two conversions: every file's bytes, by relative path
(the conversions themselves are timed by the benchmark; ``one_gguf_parse`` is tested in
tests/test_llm_models.py)."""

from __future__ import annotations

from benchmarks.conversion_bench import file_hashes


def test_file_hashes_name_every_file_by_its_relative_path_and_tell_bytes_apart(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for copy in (first, second):
        (copy / "sub").mkdir(parents=True)
        (copy / "config.json").write_text('{"a": 1}')
        (copy / "sub" / "weights.bin").write_bytes(b"\x00\x01")
    assert file_hashes(first) == file_hashes(second)
    assert sorted(file_hashes(first)) == ["config.json", "sub/weights.bin"]
    (second / "sub" / "weights.bin").write_bytes(b"\x00\x02")
    assert file_hashes(first) != file_hashes(second)
    (second / "extra.txt").write_text("")
    assert "extra.txt" in file_hashes(second)
