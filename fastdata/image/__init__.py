"""The image read side: decode, region decoder, augment, batch types, worker pipeline, device decode,
datasets, ImageLoader."""
