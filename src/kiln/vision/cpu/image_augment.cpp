// CPU kernel of augment_images (see vision/augment_math.h for the random choices).
#include "kiln/vision/augment_math.h"
#include "kiln/vision/image_augment_kernels.h"

namespace kiln::vision::cpu {

void augment_images(const Tensor& images, const Tensor& indices, const Tensor& out, const AugmentParams& p) {
  const std::int64_t n = images.shape()[0], c = images.shape()[1], h = images.shape()[2], w = images.shape()[3];
  const auto* src = static_cast<const std::uint8_t*>(images.data_ptr());
  const auto* idx = static_cast<const std::int64_t*>(indices.data_ptr());
  float* dst = static_cast<float*>(out.data_ptr());
  const std::int64_t batch = indices.shape()[0];
  for (std::int64_t b = 0; b < batch; ++b) {
    KILN_CHECK(idx[b] >= 0 && idx[b] < n, "augment_images: index {} out of range for {} images", idx[b], n);
    BatchAugmentChoice ch = augment_choice(p, static_cast<std::uint64_t>(b));
    for (std::int64_t ci = 0; ci < c; ++ci) {
      const std::uint8_t* plane = src + (idx[b] * c + ci) * h * w;
      float* o = dst + (b * c + ci) * h * w;
      const float scale = 1.0f / (255.0f * p.std[ci]), shift = -p.mean[ci] / p.std[ci];
      for (std::int64_t y = 0; y < h; ++y) {
        const std::int64_t sy = y + ch.dy;
        for (std::int64_t x = 0; x < w; ++x) {
          const std::int64_t xx = ch.flip ? w - 1 - x : x;
          const std::int64_t sx = xx + ch.dx;
          const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
          // Padding is a zero byte, normalised like any pixel (torchvision pads before Normalize).
          o[y * w + x] = (inside ? plane[sy * w + sx] : 0) * scale + shift;
        }
      }
    }
  }
}

}  // namespace kiln::vision::cpu
