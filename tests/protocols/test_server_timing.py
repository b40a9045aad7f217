"""Server-Timing parsing (W3C syntax), as any server may send it."""

from latscope.protocols.server_timing import parse_server_timing


def test_durations_by_name_and_entries_without_dur_skipped():
    value = 'queue;dur=0.120, compute;dur=3.5;desc="batch, of 4", cache;desc=hit, batch;desc="4"'
    assert parse_server_timing(value) == {"queue": 0.12, "compute": 3.5}


def test_spacing_case_quoted_dur_and_repeats():
    value = 'db ; DUR = 53 ,  app;desc="x;y";dur="47.2", db;dur=1'
    assert parse_server_timing(value) == {"db": 53.0, "app": 47.2}  # a repeated name keeps its first


def test_garbage_negative_and_non_finite_are_dropped():
    assert parse_server_timing("") == {}
    assert parse_server_timing("a;dur=abc, b;dur=-1, c;dur=inf, d;dur=nan, e;dur=2") == {"e": 2.0}
    assert parse_server_timing("ok;dur=1, ;;; broken") == {"ok": 1.0}  # what came before the garbage stays
