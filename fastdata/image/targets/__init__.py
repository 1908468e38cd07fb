"""What a sample carries beside its image, as the loaders give it: class labels, one or several (`labels`);
captions and their token ids for image-text pairs (`captions`); detection targets, boxes and instance masks moved
with the image's geometry (`boxes`, `detection`, `detection_custom` for your own transforms); semantic
segmentation label maps (`segmentation`, `segmentation_custom`)."""
