"""Image checks: what an encoded file is, and what the packer stores of it.

- :mod:`.sniff`: the format sniff and the one pixel limit (pack time and read time alike);
- :mod:`.normalize`: the pack-time check and pixel normalisation of one image;
- :mod:`.neardup`: 64-bit pHash, degenerate images and the near-duplicate pair search.
"""
