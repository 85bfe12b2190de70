// fitplan-dump-nodes: run token ids through llama.cpp on the CPU and write every graph node it
// computes, so that tests can compare the embedded runtime's nodes with llama.cpp's bit for bit.
//
//   fitplan-dump-nodes MODEL OUT_DIR N_CTX BATCH_SIZES TOKEN...
//
// BATCH_SIZES is a comma list (e.g. "2,4,1,1"): the tokens are decoded in batches of those sizes,
// one after another, logits for the last token of each batch. Batch k writes OUT_DIR/step<k>.bin:
// per node, in the order the scheduler computed them,
//   u32 len, name | u32 len, op description | u32 is_view | u32 ggml type |
//   i64 ne[4] | i64 nb[4] | u64 n_bytes | the tensor's bytes
// Built by scripts/build_llama_cpp.sh against the same static libraries as the llama.cpp tools.
#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static FILE * g_out = nullptr;

static void put_u32(uint32_t v) { fwrite(&v, sizeof v, 1, g_out); }

static void put_str(const char * s) {
    put_u32((uint32_t) strlen(s));
    fwrite(s, 1, strlen(s), g_out);
}

// eval callback: asked first whether we want the node (yes), then called with its data
static bool on_node(struct ggml_tensor * t, bool ask, void *) {
    if (ask || g_out == nullptr) {
        return true;
    }
    const size_t n = ggml_nbytes(t);
    std::vector<char> data(n);
    ggml_backend_tensor_get(t, data.data(), 0, n);
    put_str(t->name);
    put_str(ggml_op_desc(t));
    put_u32(t->view_src != nullptr);
    put_u32((uint32_t) t->type);
    for (int i = 0; i < 4; i++) { int64_t v = t->ne[i]; fwrite(&v, sizeof v, 1, g_out); }
    for (int i = 0; i < 4; i++) { int64_t v = (int64_t) t->nb[i]; fwrite(&v, sizeof v, 1, g_out); }
    uint64_t nn = n;
    fwrite(&nn, sizeof nn, 1, g_out);
    fwrite(data.data(), 1, n, g_out);
    return true;
}

int main(int argc, char ** argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s MODEL OUT_DIR N_CTX BATCH_SIZES TOKEN...\n", argv[0]);
        return 2;
    }
    const std::string out_dir = argv[2];
    std::vector<int> sizes;
    for (const char * p = argv[4]; *p; ) {
        sizes.push_back(atoi(p));
        const char * comma = strchr(p, ',');
        if (!comma) break;
        p = comma + 1;
    }
    std::vector<llama_token> tokens;
    for (int i = 5; i < argc; i++) tokens.push_back(atoi(argv[i]));

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) atoi(argv[3]);
    cp.cb_eval = on_node;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create a context\n"); return 1; }

    size_t at = 0;
    for (size_t k = 0; k < sizes.size() && at < tokens.size(); k++) {
        const int n = sizes[k];
        if (n <= 0 || at + n > tokens.size()) { fprintf(stderr, "batch sizes do not fit the tokens\n"); return 2; }
        llama_batch batch = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            batch.token[i] = tokens[at + i];
            batch.pos[i] = (llama_pos) (at + i);
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = i == n - 1;
        }
        batch.n_tokens = n;
        const std::string path = out_dir + "/step" + std::to_string(k) + ".bin";
        g_out = fopen(path.c_str(), "wb");
        if (!g_out) { fprintf(stderr, "cannot write %s\n", path.c_str()); return 1; }
        const int rc = llama_decode(ctx, batch);
        fclose(g_out);
        g_out = nullptr;
        llama_batch_free(batch);
        if (rc != 0) { fprintf(stderr, "llama_decode failed: %d\n", rc); return 1; }
        at += n;
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
