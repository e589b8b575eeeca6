"""Host addresses are checked as host names or IP addresses before anything looks them up."""
import pytest

from remote.cluster import ClusterError, Host, parse_host


@pytest.mark.parametrize("address", ["gpu1", "node-07.lab.example", "10.0.0.1", "::1", "fe80::1%eth0", "127.0.0.2"])
def test_host_names_and_addresses_pass(address):
    assert Host(address=address).address == address


@pytest.mark.parametrize("address", ["a;rm -rf /", "$(id)", "`id`", "a b", "-oProxyCommand=x", "h|cat", "h&", "h\n"])
def test_anything_else_is_not_a_host(address):
    with pytest.raises(ValueError, match="not a host name or IP address"):
        Host(address=address)
    with pytest.raises(ClusterError, match="not a host name or IP address"):
        parse_host(f"me@{address}")
