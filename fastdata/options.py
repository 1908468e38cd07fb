"""The option objects of `fastdata.loader`, `fastdata.dataset` and `fastdata.mix`, by their public names
(`from fastdata.options import Output, TextOptions, ...`), so that user code never names the modules that
implement them:

- `Output(dtype, mean, std, channels_last)`: what image batches are made of (`output=`);
- `TextOptions(seq_len, packing, max_length, bucketing, eos_token, boundaries, mask_cross_document)`: how text is
  cut into rows (`text=`);
- `RemoteOptions(cache_dir, cache_max_bytes, storage_options)`: how a remote dataset is read (`remote=`);
- `MixOptions(samples_per_epoch, epoch_end, exhausted)`: a mixture's epoch (`mixing=`);
- `DeviceDecode(...)`: the device path's decoder (`decode=`, also `fastdata.DeviceDecode`).

The keywords these group (`dtype=`, `seq_len=`, `cache_dir=`, `samples_per_epoch=`, ...) are still taken.
"""

from __future__ import annotations

from fastdata.formats.remote import RemoteOptions
from fastdata.image.device.options import DeviceDecode
from fastdata.loader.options import MixOptions, Output
from fastdata.text.loader import TextOptions

__all__ = ["DeviceDecode", "MixOptions", "Output", "RemoteOptions", "TextOptions"]
