"""`decode="device"`: JPEGs decoded and cropped on the device, beside the training step.

    ship.py        worker side: what the device takes, the bytes and crop parameters it gets (sub-JPEGs)
    options.py     DeviceDecode, the user's options
    decoders.py    the BatchDecoder protocol, torchvision's decoder, which decoder a loader gets
    nvimgcodec.py  NVIDIA nvImageCodec behind the protocol
    probes.py      whether a decoder may be given restart-layout sub-JPEGs; whether the JPEG engines alone decode
    choice.py      the decoder a loader makes: DeviceDecode(backends="auto") resolved for its dataset and GPU
    kernels.py     the one batched crop-resize-flip
    stage.py       one worker batch -> one device batch (decode, crop, normalise, the workers' pixels)
    policy.py      what is counted, said once, skipped or raised when bytes do not decode
    ring.py        SlotRing: preallocated output slots handed over with CUDA events
    feeder.py      DeviceFeeder: the thread that runs the stage beside the training step

docs/gpu.md says what it gives and how to use it.
"""
