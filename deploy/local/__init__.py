"""The local platform, `shoal up`: the server, the local backend (zygote fork) and the device inventory."""
