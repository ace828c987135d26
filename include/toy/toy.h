/* toy/toy.h: the whole public API of libtoy. */
#ifndef TOY_TOY_H
#define TOY_TOY_H
#include "toy/status.h"
#include "toy/dtype.h"
#include "toy/tensor.h"
#include "toy/threadpool.h"
#include "toy/graph.h"
#include "toy/device.h"
#include "toy/quant.h"
#include "toy/gguf.h"
#include "toy/safetensors.h"
#include "toy/convert.h"
#include "toy/models.h"
#include "toy/optim.h"
#include "toy/rng.h"
#include "toy/llama.h"
#include "toy/gpt2.h"
#include "toy/vit.h"
#include "toy/images.h"
#include "toy/classify.h"
#define TOY_VERSION "0.1.0"
#endif
