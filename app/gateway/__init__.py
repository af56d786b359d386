"""`board gateway`: the team's OpenAI-compatible front door (docs/gateway.md).

routing.py holds what the gateway knows (servers, planned servers, keys: the service's gateway_state) and the
admission rules (least outstanding, drain, class-ordered queue, per-key cap), without HTTP; server.py is the
aiohttp application that relays requests and streams, and the thread that follows the service over its socket.
"""
