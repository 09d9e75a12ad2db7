#pragma once
// A 3-vector of doubles and the few operations the MD code needs; positions are in nm.
#include <array>
#include <cmath>

namespace kiln::md {

using Vec3 = std::array<double, 3>;

inline Vec3 operator+(const Vec3& a, const Vec3& b) { return {a[0] + b[0], a[1] + b[1], a[2] + b[2]}; }
inline Vec3 operator-(const Vec3& a, const Vec3& b) { return {a[0] - b[0], a[1] - b[1], a[2] - b[2]}; }
inline Vec3 operator*(double s, const Vec3& a) { return {s * a[0], s * a[1], s * a[2]}; }
inline Vec3& operator+=(Vec3& a, const Vec3& b) {
  a[0] += b[0];
  a[1] += b[1];
  a[2] += b[2];
  return a;
}
inline Vec3& operator-=(Vec3& a, const Vec3& b) {
  a[0] -= b[0];
  a[1] -= b[1];
  a[2] -= b[2];
  return a;
}
inline double dot(const Vec3& a, const Vec3& b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }
inline Vec3 cross(const Vec3& a, const Vec3& b) {
  return {a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]};
}
inline double norm(const Vec3& a) { return std::sqrt(dot(a, a)); }

// A 3x3 tensor (virial, kinetic energy, pressure), row-major: m[a][b].
using Mat3 = std::array<std::array<double, 3>, 3>;
// m += scale * (a outer b)
inline void add_outer(Mat3& m, const Vec3& a, const Vec3& b, double scale = 1.0) {
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) m[i][j] += scale * a[i] * b[j];
}
inline Mat3& operator+=(Mat3& m, const Mat3& o) {
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) m[i][j] += o[i][j];
  return m;
}

// The displacement b - a under the minimum-image convention of a rectangular box.
inline Vec3 min_image(const Vec3& d, const Vec3& box) {
  Vec3 r = d;
  for (int k = 0; k < 3; ++k) r[k] -= box[k] * std::nearbyint(r[k] / box[k]);
  return r;
}

}  // namespace kiln::md
