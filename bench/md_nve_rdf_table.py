#!/usr/bin/python3
"""bench/md_nve_rdf.sh's comparison: per engine, the drift of `Conserved En.` (least-squares slope,
kJ/mol/ns per atom) and its standard deviation around the fit; the water O-O radial distribution
function from each engine's frames (after the common start), its first peak and minimum, and how far the curves differ in
units of their combined standard error (4 blocks of frames).
Usage: md_nve_rdf_table.py --atoms N NAME=ENERGIES NAME=FRAMES.gro ...
  ENERGIES: kiln's energy.json, the OpenMM script's JSON, or a `gmx energy` .xvg (time, Conserved)."""
import argparse
import json
import math


def read_energies(path):
    if path.endswith('.xvg'):
        t, e = [], []
        for line in open(path):
            if line[0] in '#@':
                continue
            v = line.split()
            t.append(float(v[0]))
            e.append(float(v[1]))
        return t, e
    frames = json.load(open(path))['frames']
    return [f['time'] for f in frames], [f['Conserved En.'] for f in frames]


def drift(t, e, atoms):
    n = len(t)
    mt, me = sum(t) / n, sum(e) / n
    stt = sum((x - mt) ** 2 for x in t)
    slope = sum((x - mt) * (y - me) for x, y in zip(t, e)) / stt  # kJ/mol/ps
    resid = [y - (me + slope * (x - mt)) for x, y in zip(t, e)]
    sd = math.sqrt(sum(r * r for r in resid) / (n - 2))
    return slope * 1000 / atoms, sd, t[-1] - t[0]


def read_frames(path):
    lines = open(path).read().splitlines()
    k, frames = 0, []
    while k < len(lines) and lines[k].strip():
        n = int(lines[k + 1])
        atoms = lines[k + 2:k + 2 + n]
        box = [float(v) for v in lines[k + 2 + n].split()[:3]]
        oxygens = [(float(a[20:28]), float(a[28:36]), float(a[36:44])) for a in atoms if a[10:15].strip() == 'OW']
        frames.append((oxygens, box))
        k += n + 3
    return frames


def rdf(frames, dr, rmax):
    bins = int(rmax / dr)
    per_frame = []
    for ox, box in frames:
        h = [0] * bins
        n = len(ox)
        for i in range(n):
            xi, yi, zi = ox[i]
            for j in range(i + 1, n):
                dx = ox[j][0] - xi
                dy = ox[j][1] - yi
                dz = ox[j][2] - zi
                dx -= box[0] * round(dx / box[0])
                dy -= box[1] * round(dy / box[1])
                dz -= box[2] * round(dz / box[2])
                r = math.sqrt(dx * dx + dy * dy + dz * dz)
                if r < rmax:
                    h[int(r / dr)] += 2
        rho = n / (box[0] * box[1] * box[2])
        per_frame.append([h[b] / (n * rho * 4 / 3 * math.pi * (((b + 1) * dr) ** 3 - (b * dr) ** 3))
                          for b in range(bins)])
    return per_frame


def mean_and_error(per_frame, blocks=4):
    bins = len(per_frame[0])
    blocks = min(blocks, len(per_frame))
    if blocks < 2:
        raise SystemExit('the RDF error needs at least 2 frames')
    mean = [sum(f[b] for f in per_frame) / len(per_frame) for b in range(bins)]
    size = len(per_frame) // blocks
    block_means = [[sum(f[b] for f in per_frame[k * size:(k + 1) * size]) / size for b in range(bins)]
                   for k in range(blocks)]
    err = [math.sqrt(sum((m[b] - mean[b]) ** 2 for m in block_means) / (blocks - 1) / blocks) for b in range(bins)]
    return mean, err


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--atoms', type=int, required=True)
    p.add_argument('--energies', nargs='+', default=[], metavar='NAME=PATH')
    p.add_argument('--frames', nargs='+', default=[], metavar='NAME=PATH')
    p.add_argument('--dr', type=float, default=0.01)
    p.add_argument('--rmax', type=float, default=0.9)
    a = p.parse_args()
    print(f'{"engine":<28} {"span ps":>8} {"drift kJ/mol/ns/atom":>21} {"sd kJ/mol":>10}')
    for item in a.energies:
        name, path = item.split('=', 1)
        d, sd, span = drift(*read_energies(path), a.atoms)
        print(f'{name:<28} {span:8.1f} {d:21.4f} {sd:10.3f}')
    curves = {}
    for item in a.frames:
        name, path = item.split('=', 1)
        frames = read_frames(path)[1:]  # every engine's first frame is the common start
        curves[name] = (len(frames), *mean_and_error(rdf(frames, a.dr, a.rmax)))
    if not curves:
        return
    print()
    print(f'O-O g(r), bins of {a.dr} nm; first peak, first minimum (bin centres); errors from 4 blocks of frames')
    first = None
    for name, (count, g, err) in curves.items():
        peak = max(range(len(g)), key=lambda b: g[b])
        minimum = min(range(peak, min(len(g), peak + int(0.25 / a.dr))), key=lambda b: g[b])
        print(f'{name:<28} {count:3d} frames: peak {g[peak]:.3f} +- {err[peak]:.3f} at {(peak + 0.5) * a.dr:.3f} nm, '
              f'minimum {g[minimum]:.3f} +- {err[minimum]:.3f} at {(minimum + 0.5) * a.dr:.3f} nm')
        if first is None:
            first = name
    name0 = first
    g0, e0 = curves[name0][1], curves[name0][2]
    for name, (count, g, err) in curves.items():
        if name == name0:
            continue
        z = [(g[b] - g0[b]) / math.sqrt(err[b] ** 2 + e0[b] ** 2) for b in range(len(g))
             if (err[b] ** 2 + e0[b] ** 2) > 0 and (b + 0.5) * a.dr > 0.24]
        rms = math.sqrt(sum(v * v for v in z) / len(z))
        within = sum(1 for v in z if abs(v) <= 2) / len(z)
        print(f'{name} - {name0}: rms of the difference over its standard error {rms:.2f} ({len(z)} bins from '
              f'0.24 nm; {within * 100:.0f}% within 2 errors; equal curves give about 1.2 and 91% with errors '
              f'from 4 blocks, about 6 degrees of freedom per bin)')


if __name__ == '__main__':
    main()
