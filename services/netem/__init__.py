"""A userspace network emulator (TCP delay proxy) that puts real distance between the edge
and each region on one machine."""
