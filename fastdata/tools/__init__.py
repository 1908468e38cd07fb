"""Commands over datasets and machines: info, verify, bench, doctor, disks, demo, sample."""
