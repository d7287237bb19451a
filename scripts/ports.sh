# Ports on 127.0.0.1 for the private servers of scripts/postgres.sh and scripts/kafka.sh (sourced by both).

port_taken() {
    # a listener holds it (SO_REUSEADDR: the TIME_WAIT sockets a server just stopped leaves behind do not count,
    # as they do not stop the server from binding it again)
    python3 - "$1" <<'PY'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(0)   # taken
sys.exit(1)
PY
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
