import socket

import pytest


def test_sockets_are_blocked():
    with pytest.raises(Exception, match="socket"):
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)


@pytest.mark.enable_socket
def test_marker_allows_sockets():
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
