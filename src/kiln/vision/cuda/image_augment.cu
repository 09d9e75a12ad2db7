// CUDA kernel of augment_images: one thread per output pixel; the per-row random choice is
// recomputed by each thread (10 Philox rounds are cheaper than a second launch).
#include <algorithm>

#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/vendor/cuda.h"
#include "kiln/vision/augment_math.h"
#include "kiln/vision/image_augment_kernels.h"

namespace kiln::vision::cuda {

namespace {
__global__ void augment_kernel(const std::uint8_t* __restrict__ src, const std::int64_t* __restrict__ idx,
                               float* __restrict__ dst, std::int64_t batch, int c, int h, int w, AugmentParams p) {
  const std::int64_t total = batch * c * h * w;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int x = static_cast<int>(i % w);
    const int y = static_cast<int>((i / w) % h);
    const int ci = static_cast<int>((i / (static_cast<std::int64_t>(w) * h)) % c);
    const std::int64_t b = i / (static_cast<std::int64_t>(w) * h * c);
    BatchAugmentChoice ch = augment_choice(p, static_cast<std::uint64_t>(b));
    const int sy = y + ch.dy;
    const int sx = (ch.flip ? w - 1 - x : x) + ch.dx;
    float v = 0.f;  // padding: a zero byte, normalised like any pixel (as torchvision)
    if (sy >= 0 && sy < h && sx >= 0 && sx < w) v = src[((idx[b] * c + ci) * h + sy) * w + sx];
    dst[i] = v * (1.0f / (255.0f * p.std[ci])) - p.mean[ci] / p.std[ci];
  }
}
}  // namespace

void augment_images(const Tensor& images, const Tensor& indices, const Tensor& out, const AugmentParams& p) {
  const std::int64_t batch = indices.shape()[0];
  const int c = static_cast<int>(images.shape()[1]), h = static_cast<int>(images.shape()[2]),
            w = static_cast<int>(images.shape()[3]);
  const std::int64_t total = batch * c * h * w;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<std::int64_t>((total + threads - 1) / threads, 65535));
  DeviceGuard guard(images.device().index);
  augment_kernel<<<blocks, threads, 0, cuda_stream(images.device().index)>>>(
      static_cast<const std::uint8_t*>(images.data_ptr()), static_cast<const std::int64_t*>(indices.data_ptr()),
      static_cast<float*>(out.data_ptr()), batch, c, h, w, p);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::vision::cuda
