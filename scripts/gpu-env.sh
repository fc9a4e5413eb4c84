# Source on the GPU machine before running kiln there: the CUDA libraries (cuBLAS, cuDNN, NVRTC)
# live in the Python environment's nvidia packages, not in /usr/local/cuda/lib64.
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
export LD_LIBRARY_PATH=$(ls -d "$SP"/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}
