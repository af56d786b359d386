"""The door: `board agent`'s socket, the events it pushes, and the one database thread every operation runs on."""
