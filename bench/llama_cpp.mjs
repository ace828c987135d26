// bench/llama_cpp.mjs: llama.cpp's CPU kernels (the npm package
// node-llama-cpp, prebuilt) on a GGUF file, with the protocol of
// `bench-llama THREADS M file MODEL.gguf`: a 256-token prompt (ids
// (31 i + 7) mod vocab), then 64 tokens greedily; best of 5 per thread count
// (this machine's memory bandwidth swings between runs: more, longer runs
// steady both sides' best).
// Prints one JSON line per thread count. Run with UV_THREADPOOL_SIZE=1 (the
// package's worker pool otherwise competes with llama.cpp's threads).
// Usage: node bench/llama_cpp.mjs MODEL.gguf THREADS...
import {getLlama} from "node-llama-cpp";

const [path, ...ths] = process.argv.slice(2);
const threads = ths.length ? ths.map(Number) : [1, 2];
const llama = await getLlama({gpu: false, build: "never", logLevel: "error", maxThreads: Math.max(...threads)});
const model = await llama.loadModel({modelPath: path, gpuLayers: 0});
const vocab = model.tokens.vocabSize ?? model.fileInsights.vocabularySize;
const GEN = 64, REPS = 5;
const prompt = Array.from({length: 256}, (_, i) => (i * 31 + 7) % vocab);
for (const t of threads) {
    const ctx = await model.createContext({contextSize: 512, batchSize: 512, threads: {ideal: t, min: t}});
    const seq = ctx.getSequence();
    let bp = 0, bd = 0;
    for (let rep = 0; rep < REPS; rep++) {
        await seq.clearHistory();
        let t0 = performance.now();
        await seq.evaluateWithoutGeneratingNewTokens(prompt);
        const tp = (performance.now() - t0) / 1e3;
        t0 = performance.now();
        let n = 0;
        for await (const tok of seq.evaluate([prompt[255]], {temperature: 0})) {
            void tok;
            if (++n >= GEN) break;
        }
        const td = (performance.now() - t0) / 1e3;
        bp = Math.max(bp, 256 / tp);
        bd = Math.max(bd, n / td);
    }
    console.log(JSON.stringify({bench: "llama_cpp", threads: t, prefill_tok_s: +bp.toFixed(1), decode_tok_s: +bd.toFixed(1)}));
    await ctx.dispose();
}
await model.dispose();
await llama.dispose();
