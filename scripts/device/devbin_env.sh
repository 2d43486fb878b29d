# Sourced (not run) ON the GPU machine by the scripts of scripts/device/, in the repo root with
# .devbin carried: unpacks the programs that collect.sh packed into .devbin/bin and points
# LD_LIBRARY_PATH at the libraries carried from the build machine, then CUDA's own (the toolkit's
# and the pip wheels'). Returns 2 when .devbin holds no programs.
if [ -f .devbin/programs.tar.gz ]; then
  tar -C .devbin -xzf .devbin/programs.tar.gz
fi
if [ ! -d .devbin/bin ]; then
  echo "device: no .devbin/bin: build and collect on the build machine, then carry .devbin"
  return 2
fi
LIBDIR=/tmp/mlakit-devlib
rm -rf "$LIBDIR" && mkdir -p "$LIBDIR" && tar -C "$LIBDIR" -xzf .devbin/lib.tar.gz
cuda_dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && cuda_dirs="$cuda_dirs:$d"
done
py_dirs=$(python3 - 2>/dev/null <<'PY'
import importlib, os
dirs = []
for mod in ("nvidia.cublas", "nvidia.cuda_runtime", "nvidia.cu13", "nvidia.nccl"):
    try:
        m = importlib.import_module(mod)
    except Exception:
        continue
    for base in getattr(m, "__path__", []):
        for sub in ("lib", "lib64"):
            p = os.path.join(base, sub)
            if os.path.isdir(p):
                dirs.append(p)
print(":".join(dirs))
PY
)
export LD_LIBRARY_PATH="$LIBDIR/lib${cuda_dirs}${py_dirs:+:$py_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
