"""ddtree-ops LAB: something else listening on the service port (the `port-busy` fault).

Waits until the port is free (the service restarting) and takes it, so the next server start meets a
real EADDRINUSE. `python3 squat.py HOST PORT`.
"""

import socket
import sys
import time

if __name__ == "__main__":
    host, port = sys.argv[1], int(sys.argv[2])
    while True:
        s = socket.socket()
        # as uvicorn does: TIME_WAIT sockets of the old server must not keep us out
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(16)
            break
        except OSError:
            s.close()
            time.sleep(0.05)
    while True:
        conn, _ = s.accept()
        conn.close()
