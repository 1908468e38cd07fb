"""JPEG below the decoder: the frame header walk (`header`: coding process, precision, sampling, and how the GPU's
decoders take a file), the libjpeg-turbo this process uses (`library`), the region decoder that decodes only a
crop at the smallest DCT scale (`region`, over the C extension `fastdata.image._jpeg_region`: `extension` says
whether it was built and what to install where it was not), and the restart layout (`restart`: the lossless rewrite
with a restart marker per MCU, and the sub-JPEG of a crop)."""
