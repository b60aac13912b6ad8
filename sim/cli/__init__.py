"""The `kvsim` command line: its commands (`main`) and the guard that turns bad input, interrupts and
internal errors into one line and an exit code (`guard`). The top layer: may import any package."""
