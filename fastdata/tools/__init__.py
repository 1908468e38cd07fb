"""Commands over datasets and machines: info, verify (a room), bench, tune, doctor (a room: its checks, the GPU's,
the table, the disks), demo, sample."""
