"""`board gateway`: the team's OpenAI-compatible front door (docs/gateway.md).

routing.py holds what the gateway knows (servers, planned servers, keys: the service's gateway_state) and the
admission rules (least outstanding, drain, per-member cap), without HTTP; waiting.py is the queue of requests
waiting for a slot, in the order they are served (class, project's fair share, members' turns, first come);
demand.py starts the team catalog's models ([[models]]) when a request names a cold one, hands it to their
fallbacks, and keeps them in use (models_touch); server.py is the aiohttp application that relays requests and
streams, and the thread that follows the service over its socket.
"""
