#pragma once
// Moore Threads MUSA: maps the CUDA, cuBLAS, cuDNN and NCCL names Kiln uses onto MUSA's, the way
// ggml and GROMACS do it. Selected by -DKILN_VENDOR_MUSA; not built in this tree yet (no MUSA
// toolchain here). Extend the list when a kernel starts using a new runtime name. Not yet mapped:
// the cuBLASLt descriptor API (ops/cuda/gemm.cpp) and the cuDNN legacy convolution API
// (ops/cuda/conv.cpp), whose muBLAS/muDNN counterparts differ in shape, not just in name.
#include <mublas.h>
#include <mublasLt.h>
#include <musa_bf16.h>
#include <musa_fp16.h>
#include <musa_runtime.h>

#define cudaError_t musaError_t
#define cudaSuccess musaSuccess
#define cudaGetErrorString musaGetErrorString
#define cudaGetErrorName musaGetErrorName
#define cudaGetLastError musaGetLastError
#define cudaGetDeviceCount musaGetDeviceCount
#define cudaGetDeviceProperties musaGetDeviceProperties
#define cudaDeviceProp musaDeviceProp
#define cudaSetDevice musaSetDevice
#define cudaGetDevice musaGetDevice
#define cudaDeviceSynchronize musaDeviceSynchronize
#define cudaMalloc musaMalloc
#define cudaFree musaFree
#define cudaMallocHost musaMallocHost
#define cudaHostAlloc musaHostAlloc
#define cudaFreeHost musaFreeHost
#define cudaMemGetInfo musaMemGetInfo
#define cudaMemcpy musaMemcpy
#define cudaMemcpyAsync musaMemcpyAsync
#define cudaMemsetAsync musaMemsetAsync
#define cudaMemcpyHostToDevice musaMemcpyHostToDevice
#define cudaMemcpyDeviceToHost musaMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice musaMemcpyDeviceToDevice
#define cudaMemcpyDefault musaMemcpyDefault
#define cudaStream_t musaStream_t
#define cudaStreamCreateWithFlags musaStreamCreateWithFlags
#define cudaStreamNonBlocking musaStreamNonBlocking
#define cudaStreamSynchronize musaStreamSynchronize
#define cudaStreamDestroy musaStreamDestroy
#define cudaStreamWaitEvent musaStreamWaitEvent
#define cudaEvent_t musaEvent_t
#define cudaEventCreate musaEventCreate
#define cudaEventCreateWithFlags musaEventCreateWithFlags
#define cudaEventRecord musaEventRecord
#define cudaEventSynchronize musaEventSynchronize
#define cudaEventElapsedTime musaEventElapsedTime
#define cudaEventDestroy musaEventDestroy
#define cudaGraph_t musaGraph_t
#define cudaGraphExec_t musaGraphExec_t
#define cudaStreamBeginCapture musaStreamBeginCapture
#define cudaStreamEndCapture musaStreamEndCapture
#define cudaStreamCaptureModeThreadLocal musaStreamCaptureModeThreadLocal
#define cudaGraphInstantiate musaGraphInstantiate
#define cudaGraphLaunch musaGraphLaunch
#define cudaGraphDestroy musaGraphDestroy
#define cudaGraphExecDestroy musaGraphExecDestroy
#define cudaHostAllocDefault musaHostAllocDefault
#define __nv_bfloat16 __mt_bfloat16
#define cudaDeviceGetAttribute musaDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount musaDevAttrMultiProcessorCount
#define cudaDevAttrMaxThreadsPerMultiProcessor musaDevAttrMaxThreadsPerMultiProcessor
#define cudaDevAttrMaxSharedMemoryPerBlockOptin musaDevAttrMaxSharedMemoryPerBlockOptin
#define cudaDataType_t musaDataType_t
#define CUDA_R_32F MUSA_R_32F
#define CUDA_R_64F MUSA_R_64F
#define CUDA_R_16F MUSA_R_16F
#define CUDA_R_16BF MUSA_R_16BF
#define cublasStatus_t mublasStatus_t
#define CUBLAS_STATUS_SUCCESS MUBLAS_STATUS_SUCCESS
#define cublasHandle_t mublasHandle_t
#define cublasCreate mublasCreate
#define cublasSetStream mublasSetStream
#define cublasLtHandle_t mublasLtHandle_t
#define cublasLtCreate mublasLtCreate
#define cublasLtMatmul mublasLtMatmul
#define cudnnStatus_t mudnnStatus_t
#define ncclResult_t mcclResult_t
#define ncclSuccess mcclSuccess
#define ncclComm_t mcclComm_t
#define ncclUniqueId mcclUniqueId
#define ncclGetUniqueId mcclGetUniqueId
#define ncclCommInitRank mcclCommInitRank
#define ncclAllReduce mcclAllReduce
#define ncclBroadcast mcclBroadcast
#define ncclGetErrorString mcclGetErrorString
