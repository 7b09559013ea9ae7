// Anchor translation unit for the shared precompiled LibTorch header.
