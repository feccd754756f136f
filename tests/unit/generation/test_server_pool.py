"""Several vLLM servers: the URLs a config names, and how a call's rows are split over the servers."""

from steadyrl.generation.server_pool import split_rows
from steadyrl.generation.server_settings import group_host, server_urls


def test_a_comma_separated_list_or_a_list_names_several_servers():
    assert server_urls("http://a:8000/, http://b:8001", "0.0.0.0", 8000) == ["http://a:8000", "http://b:8001"]
    assert server_urls(["http://a:8000", "http://b:8001/"], "0.0.0.0", 8000) == ["http://a:8000", "http://b:8001"]
    assert server_urls(None, "10.0.0.5,10.0.0.6", 9000) == ["http://10.0.0.5:9000", "http://10.0.0.6:9000"]
    assert server_urls("http://a:8000", "10.0.0.5", 9000) == ["http://a:8000"], "the URL wins, as in TRL"
    assert group_host("http://127.0.0.1:8000,http://10.0.0.6:8000", "0.0.0.0") == "127.0.0.1"


def test_rows_are_dealt_to_the_servers_in_turn_and_every_row_once():
    shares = split_rows(7, 3)
    assert shares == [[0, 3, 6], [1, 4], [2, 5]]
    assert sorted(i for share in shares for i in share) == list(range(7))
    assert split_rows(1, 2) == [[0], []], "a server without rows gets no call"
