"""A real TCP proxy on a free loopback port, for tests of what a client does when
connections drop: it forwards bytes both ways to an upstream (which can be switched,
e.g. to a restarted service) and, when asked, cuts connections at chosen moments.

    proxy = TcpProxy(upstream_port)       # proxy.url == "http://127.0.0.1:PORT"
    proxy.cut_next_answers(2)              # the next 2 answers are dropped, connection closed
    ...; proxy.close()

``cut_next_answers(n)``: the next ``n`` times the upstream starts sending on a
connection, those bytes are thrown away and both sides are closed. The request has
then reached the service and been processed; the client gets no answer (the case a
retry with the same event ids must make harmless). An upstream that cannot be reached
closes the client's connection at once.
"""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self._cuts_left = 0
        self.answers_cut = 0
        self.connections = 0
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_upstream(self, port: int, host: str = "127.0.0.1") -> None:
        """New connections go there (open ones keep their upstream)."""
        with self._lock:
            self.upstream = (host, port)

    def cut_next_answers(self, n: int) -> None:
        with self._lock:
            self._cuts_left += n

    def _take_cut(self) -> bool:
        with self._lock:
            if self._cuts_left > 0:
                self._cuts_left -= 1
                self.answers_cut += 1
                return True
            return False

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue  # wake up now and then: close() needs no connection to stop this
            except OSError:
                return
            client.settimeout(None)
            with self._lock:
                self.connections += 1
                upstream_addr = self.upstream
            try:
                upstream = socket.create_connection(upstream_addr, timeout=5)
                upstream.settimeout(None)
            except OSError:
                self._close(client)
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            asked = threading.Event()
            for src, dst, answers in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(
                    target=self._pump, args=(src, dst, answers, asked), daemon=True
                ).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, answers: bool, asked: threading.Event
    ) -> None:
        """Copy ``src`` to ``dst``. Requests set ``asked``; the first answer bytes after a
        request start an answer, which is where a cut happens."""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not answers:
                    asked.set()
                elif asked.is_set():
                    asked.clear()
                    if self._take_cut():
                        break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._close(src)
            self._close(dst)

    def _close(self, sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
        with self._lock:
            self._sockets.discard(sock)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            self._close(sock)
        self._acceptor.join(timeout=5)
