"""The local platform, `shoal up`: the server, the local backend (zygote fork), the device inventory
and the MPS daemon its GPU replicas share a GPU through."""
