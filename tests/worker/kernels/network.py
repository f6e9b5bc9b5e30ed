# Sandbox: tries to open a TCP connection (exfiltration, downloading an answer).
import socket


def workload(a, b):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect(("93.184.216.34", 80))
    return a @ b
