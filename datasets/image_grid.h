#pragma once
// Image grids as PNG: sample grids of `moh sample` (one row per class, labelled), written atomically.
#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace moh::datasets {

/// Writes (rows × cols) uint8 NHWC images as one PNG, scaled up by an integer factor (nearest), with an optional
/// text label left of each row and/or a caption under each tile (`tile_labels`, one per image, for rows of mixed
/// classes). Grey images replicated to RGB are written as 1-channel PNG. False when the toolkit was built without
/// OpenCV (nothing written).
bool write_grid(const std::string& path, const at::Tensor& images, int64_t cols, int scale,
                const std::vector<std::string>& row_labels, const std::vector<std::string>& tile_labels = {});

}  // namespace moh::datasets
