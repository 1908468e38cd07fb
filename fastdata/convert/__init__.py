"""Write-side drivers, generic over the source: images, text, staging, checkpoints, engines."""
