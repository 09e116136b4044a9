"""CosyVoice 2 parity fixtures: tiny random configurations of the reference modules.

Run outside the product (reference sources are NOT committed), e.g.
    python3 -m venv venv && venv/bin/pip install torch==2.3.1 transformers==4.51.3 diffusers==0.29.0 \
        conformer==0.3.2 einops omegaconf==2.3.0 scipy numpy==1.26.4 safetensors onnxruntime==1.18.0 torchaudio==2.3.1
    R=/work/.mirror/FunAudioLLM+CosyVoice/repo M=/work/.mirror/shivammehta25+Matcha-TTS/repo
    mkdir -p /tmp/cv /tmp/matcha
    git -C $R archive ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40 cosyvoice | tar -x -C /tmp/cv
    git -C $M archive dd9105b34bf2be2230f4aa1e4769fb586a3c824e matcha | tar -x -C /tmp/matcha
    COSYVOICE_SRC=/tmp/cv MATCHA_SRC=/tmp/matcha venv/bin/python make_cosyvoice2_fixtures.py OUTDIR
Writes OUTDIR/{llm,flow,hift}_*.safetensors: weights under their state-dict names (prefix 'w.'),
inputs ('in.'), outputs ('out.'), intermediates ('dbg.'), and the config as JSON metadata.
"""
import os, sys, types, json, logging, functools
sys.path[:0] = [os.environ['COSYVOICE_SRC'], os.environ['MATCHA_SRC']]   # dirs containing cosyvoice/ and matcha/
# matcha/utils/__init__.py imports hydra, lightning, rich, gdown, matplotlib, wget: stub the one
# function matcha.models.components.flow_matching needs (get_pylogger).
_mu = types.ModuleType('matcha.utils'); _mu.__path__ = []
_mp = types.ModuleType('matcha.utils.pylogger'); _mp.get_pylogger = lambda name=__name__: logging.getLogger(name)
sys.modules.setdefault('matcha.utils', _mu); sys.modules.setdefault('matcha.utils.pylogger', _mp)
import numpy as np
import torch
from safetensors.torch import save_file
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
from omegaconf import DictConfig
from transformers import Qwen2Config, Qwen2ForCausalLM
from cosyvoice.llm.llm import Qwen2LM, Qwen2Encoder
from cosyvoice.utils.common import ras_sampling
from cosyvoice.utils.mask import make_pad_mask
from cosyvoice.flow.flow import CausalMaskedDiffWithXvec
from cosyvoice.transformer.upsample_encoder import UpsampleConformerEncoder, PreLookaheadLayer, Upsample1D
from cosyvoice.flow.flow_matching import CausalConditionalCFM
from cosyvoice.flow.decoder import CausalConditionalDecoder
from cosyvoice.hifigan.generator import HiFTGenerator
from cosyvoice.hifigan.f0_predictor import ConvRNNF0Predictor

OUT = sys.argv[1] if len(sys.argv) > 1 else 'out'
os.makedirs(OUT, exist_ok=True)


def save(name, weights, inputs, outputs, config, debug=None):
    t = {}
    for p, d in (('w.', weights), ('in.', inputs), ('out.', outputs), ('dbg.', debug or {})):
        for k, v in d.items():
            v = torch.as_tensor(v)
            if v.dtype == torch.bool:
                v = v.to(torch.uint8)
            t[p + k] = v.detach().clone().contiguous()
    save_file(t, os.path.join(OUT, name + '.safetensors'), metadata={'config': json.dumps(config)})
    print(name, len(t), 'tensors')


def jitter_(module, seed):
    """Randomise parameters that default to constants (norm gains/biases, Snake alpha, weight-norm g)
    so that a loader that ignores them fails the parity test."""
    g = torch.Generator().manual_seed(seed)
    for n, p in module.named_parameters():
        if n.endswith('alpha') or n.endswith('original0') or ('norm' in n and p.dim() == 1):
            with torch.no_grad():
                if n.endswith('bias'):
                    p.add_(0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.mul_(0.5 + torch.rand(p.shape, generator=g))


# ----------------------------------------------------------------------------- sampling hook
class UniformMultinomial:
    """Replaces Tensor.multinomial(1, replacement=True) by inverse-CDF sampling with recorded
    uniforms: idx = first i with u < cumsum(p / sum(p)) computed in float64."""
    def __init__(self, seed):
        self.rs, self.log = np.random.RandomState(seed), []
    def __call__(self, probs, num_samples, replacement=False, *, generator=None):
        p = probs.double().cpu().numpy(); cdf = np.cumsum(p / p.sum()); u = self.rs.random_sample()
        i = int(min(np.searchsorted(cdf, u, side='right'), len(p) - 1))
        self.log.append((u, i, len(p)))
        return torch.tensor([i], dtype=torch.long)


# ----------------------------------------------------------------------------- LLM
def make_llm(tmp):
    S, V, H = 48, 96, 32                      # speech tokens, text vocab, hidden
    qcfg = Qwen2Config(vocab_size=V, hidden_size=H, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=512, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, use_sliding_window=False, hidden_act='silu', initializer_range=0.2,
                       torch_dtype='float32')
    torch.manual_seed(10)
    Qwen2ForCausalLM(qcfg).save_pretrained(tmp)           # Qwen2Encoder only takes a path
    sampling = functools.partial(ras_sampling, top_p=0.8, top_k=25, win_size=10, tau_r=0.1)
    torch.manual_seed(11)
    lm = Qwen2LM(llm_input_size=H, llm_output_size=H, speech_token_size=S, length_normalized_loss=True, lsm_weight=0,
                 mix_ratio=[5, 15], llm=Qwen2Encoder(tmp), sampling=sampling).eval()
    jitter_(lm, 12)
    with torch.no_grad():                     # keep random decoding short and legal
        lm.llm_decoder.bias[S] += 0.5         # eos a little likelier
        lm.llm_decoder.bias[S + 1] = -30.0    # never sample the unused token (bistream raises on it)
        lm.llm_decoder.bias[S + 2] = -30.0    # fill token only where bistream forces it (sampled after text ends, it raises)
    weights = lm.state_dict()
    g = torch.Generator().manual_seed(13)
    text = torch.randint(0, V, (1, 7), generator=g); prompt_text = torch.randint(0, V, (1, 4), generator=g)
    prompt_speech = torch.randint(0, S, (1, 12), generator=g); target = torch.randint(0, S, (1, 9), generator=g)
    ins = dict(text=text, prompt_text=prompt_text, prompt_speech_token=prompt_speech, teacher_speech_token=target)
    outs, dbg = {}, {}
    with torch.no_grad():
        # (a) full-sequence forward (teacher forcing), as Qwen2LM builds lm_input in inference()
        emb = lm.llm.model.model.embed_tokens
        sos = lm.llm_embedding.weight[lm.sos].reshape(1, 1, -1); task = lm.llm_embedding.weight[lm.task_id].reshape(1, 1, -1)
        lm_input = torch.cat([sos, emb(torch.cat([prompt_text, text], 1)), task, lm.speech_embedding(prompt_speech),
                              lm.speech_embedding(target)], 1)
        hidden, _ = lm.llm(lm_input, torch.tensor([lm_input.shape[1]]))
        outs['teacher_logp'] = lm.llm_decoder(hidden).log_softmax(-1)
        dbg['teacher_lm_input'] = lm_input; dbg['teacher_hidden'] = hidden
    # (b) autoregressive inference() with RAS sampling driven by recorded uniforms
    for mode in ('unistream', 'bistream'):
        mult = UniformMultinomial(14 if mode == 'unistream' else 15)
        steps = []
        real = lm.sampling
        def rec(scores, decoded, k, _real=real):
            steps.append(scores.clone()); return _real(scores, decoded, k)
        lm.sampling = rec
        orig_mult = torch.Tensor.multinomial
        torch.Tensor.multinomial = lambda self, n, replacement=False, **kw: mult(self, n, replacement)
        try:
            if mode == 'unistream':
                gen = lm.inference(text=text, text_len=torch.tensor([text.shape[1]]), prompt_text=prompt_text,
                                   prompt_text_len=torch.tensor([prompt_text.shape[1]]), prompt_speech_token=prompt_speech,
                                   prompt_speech_token_len=torch.tensor([prompt_speech.shape[1]]), embedding=torch.zeros(0, 192))
            else:
                gen = lm.inference_bistream(text=(text[:, i:i + 1] for i in range(text.shape[1])), prompt_text=prompt_text,
                                            prompt_text_len=torch.tensor([prompt_text.shape[1]]), prompt_speech_token=prompt_speech,
                                            prompt_speech_token_len=torch.tensor([prompt_speech.shape[1]]), embedding=torch.zeros(0, 192))
            tokens = []
            for t in gen:
                tokens.append(t)
                assert len(tokens) < 400, 'runaway decode: change seeds/bias'
        finally:
            torch.Tensor.multinomial = orig_mult; lm.sampling = real
        outs[f'{mode}_tokens'] = torch.tensor(tokens, dtype=torch.int64)
        outs[f'{mode}_step_scores'] = torch.stack(steps)        # logp after eos masking, one row per sampling call
        ins[f'{mode}_uniforms'] = torch.tensor([u for u, _, _ in mult.log], dtype=torch.float64)  # F64
        dbg[f'{mode}_uniform_picks'] = torch.tensor([[i, n] for _, i, n in mult.log], dtype=torch.int64)
    cfg = dict(speech_token_size=S, text_vocab=V, hidden=H, qwen2=qcfg.to_dict(), mix_ratio=[5, 15], top_p=0.8, top_k=25,
               win_size=10, tau_r=0.1, min_token_text_ratio=2, max_token_text_ratio=20,
               note='multinomial replaced by inverse CDF in f64 driven by in.<mode>_uniforms')
    save('llm_tiny', weights, ins, outs, cfg, dbg)


# ----------------------------------------------------------------------------- flow
def make_flow():
    D, VOC, CH = 64, 100, 32
    CFM = DictConfig({'sigma_min': 1e-06, 'solver': 'euler', 't_scheduler': 'cosine', 'training_cfg_rate': 0.2,
                      'inference_cfg_rate': 0.7, 'reg_loss_type': 'l1'})
    torch.manual_seed(20)
    enc = UpsampleConformerEncoder(output_size=D, attention_heads=4, linear_units=96, num_blocks=2, dropout_rate=0.1,
                                   positional_dropout_rate=0.1, attention_dropout_rate=0.1, normalize_before=True,
                                   input_layer='linear', pos_enc_layer_type='rel_pos_espnet', selfattention_layer_type='rel_selfattn',
                                   input_size=D, use_cnn_module=False, macaron_style=False, static_chunk_size=5)
    # upsample_encoder.py hard-codes 512 channels for these two: rebuild them at D
    enc.pre_lookahead_layer = PreLookaheadLayer(in_channels=D, channels=D, pre_lookahead_len=3)
    enc.up_layer = Upsample1D(channels=D, out_channels=D, stride=2)
    est = CausalConditionalDecoder(in_channels=320, out_channels=80, channels=[CH], dropout=0.0, attention_head_dim=8,
                                   n_blocks=1, num_mid_blocks=2, num_heads=2, act_fn='gelu', static_chunk_size=10,
                                   num_decoding_left_chunks=-1)
    dec = CausalConditionalCFM(in_channels=240, cfm_params=CFM, n_spks=1, spk_emb_dim=80, estimator=est)  # reseeds RNG to 0!
    torch.manual_seed(21)
    flow = CausalMaskedDiffWithXvec(input_size=D, output_size=80, spk_embed_dim=192, output_type='mel', vocab_size=VOC,
                                    input_frame_rate=25, only_mask_loss=True, token_mel_ratio=2, pre_lookahead_len=3,
                                    encoder=enc, decoder=dec).eval()
    jitter_(flow, 22)
    weights = flow.state_dict()
    g = torch.Generator().manual_seed(23)
    P, N = 7, 30                                            # prompt tokens, generated tokens
    prompt_token = torch.randint(0, VOC, (1, P), generator=g); token = torch.randint(0, VOC, (1, N), generator=g)
    prompt_feat = torch.randn(1, 2 * P, 80, generator=g); embedding = torch.randn(1, 192, generator=g)
    ins = dict(prompt_token=prompt_token, token=token, prompt_feat=prompt_feat, embedding=embedding,
               rand_noise=dec.rand_noise[:, :, :2 * (P + N) + 8])
    outs, dbg = {}, {}
    with torch.no_grad():
        # (a) encoder alone, both attention modes, with and without lookahead context
        x = flow.input_embedding(torch.cat([prompt_token, token], 1)); L = x.shape[1]
        for s in (False, True):
            h, _ = flow.encoder(x, torch.tensor([L]), streaming=s)
            outs[f'encoder_full_stream{int(s)}'] = h
            h, _ = flow.encoder(x[:, :-3], torch.tensor([L - 3]), context=x[:, -3:], streaming=s)
            outs[f'encoder_ctx_stream{int(s)}'] = h
        # (b) one estimator call (the CFG batch of 2 as solve_euler builds it)
        T = 2 * L
        xe = torch.randn(2, 80, T, generator=g); mu = torch.randn(2, 80, T, generator=g); mu[1] = 0
        spks = torch.randn(2, 80, generator=g); spks[1] = 0; cond = torch.randn(2, 80, T, generator=g); cond[1] = 0
        mask = torch.ones(2, 1, T); t = torch.tensor([0.3, 0.3])
        ins.update(est_x=xe, est_mu=mu, est_spks=spks, est_cond=cond, est_mask=mask, est_t=t)
        for s in (False, True):
            outs[f'estimator_stream{int(s)}'] = est(xe, mask, mu, t, spks, cond, streaming=s)
        # (c) full flow.inference: offline, and the streaming chunk schedule of CosyVoice2Model.tts
        mel, _ = flow.inference(token=token, token_len=torch.tensor([N]), prompt_token=prompt_token, prompt_token_len=torch.tensor([P]),
                                prompt_feat=prompt_feat, prompt_feat_len=torch.tensor([2 * P]), embedding=embedding,
                                streaming=False, finalize=True)
        outs['mel_offline'] = mel
        hop, pre = 5, 3                                      # token_hop_len (25 in the release), pre_lookahead_len
        pad = int(np.ceil(P / hop) * hop - P); offset, chunks, hops = 0, [], []
        while True:
            this_hop = hop + pad if offset == 0 else hop
            if N - offset < this_hop + pre:
                break
            m, _ = flow.inference(token=token[:, :offset + this_hop + pre], token_len=torch.tensor([offset + this_hop + pre]),
                                  prompt_token=prompt_token, prompt_token_len=torch.tensor([P]), prompt_feat=prompt_feat,
                                  prompt_feat_len=torch.tensor([2 * P]), embedding=embedding, streaming=True, finalize=False)
            chunks.append(m[:, :, offset * 2:]); hops.append(this_hop); offset += this_hop
            hop = min(4 * 5, hop * 2)                        # token_max_hop_len = 4 * hop, stream_scale_factor = 2
        m, _ = flow.inference(token=token, token_len=torch.tensor([N]), prompt_token=prompt_token, prompt_token_len=torch.tensor([P]),
                              prompt_feat=prompt_feat, prompt_feat_len=torch.tensor([2 * P]), embedding=embedding,
                              streaming=False, finalize=True)  # the reference's last call passes stream=False
        chunks.append(m[:, :, offset * 2:])
        for i, c in enumerate(chunks):
            outs[f'mel_stream_chunk{i}'] = c
        outs['stream_hops'] = torch.tensor(hops)
    cfg = dict(D=D, heads=4, linear_units=96, num_blocks=2, up_blocks=4, vocab=VOC, static_chunk_size=5, decoder_channels=[CH],
               attention_head_dim=8, num_heads=2, n_blocks=1, num_mid_blocks=2, decoder_static_chunk_size=10, n_timesteps=10,
               inference_cfg_rate=0.7, token_mel_ratio=2, pre_lookahead_len=3, token_hop_len=5, prompt_tokens=P, tokens=N)
    save('flow_tiny', weights, ins, outs, cfg, dbg)


# ----------------------------------------------------------------------------- HiFT
def make_hift():
    torch.manual_seed(30)
    f0p = ConvRNNF0Predictor(num_class=1, in_channels=80, cond_channels=16)
    hift = HiFTGenerator(in_channels=80, base_channels=32, nb_harmonics=8, sampling_rate=24000, nsf_alpha=0.1, nsf_sigma=0.003,
                         nsf_voiced_threshold=10, upsample_rates=[8, 5, 3], upsample_kernel_sizes=[16, 11, 7],
                         istft_params={'n_fft': 16, 'hop_len': 4}, resblock_kernel_sizes=[3, 7, 11],
                         resblock_dilation_sizes=[[1, 3, 5]] * 3, source_resblock_kernel_sizes=[7, 7, 11],
                         source_resblock_dilation_sizes=[[1, 3, 5]] * 3, lrelu_slope=0.1, audio_limit=0.99, f0_predictor=f0p).eval()
    jitter_(hift, 31)
    with torch.no_grad():                                   # make f0 cross the 10 Hz voicing threshold both ways
        hift.f0_predictor.classifier.weight.mul_(1e4); hift.f0_predictor.classifier.bias.zero_()  # f0 ~ 4..200 Hz
    weights = hift.state_dict()                             # weight-norm as parametrizations.weight.original0/1
    g = torch.Generator().manual_seed(32)
    T = 12
    mel = torch.randn(1, 80, T, generator=g) * 0.5 - 4.0
    outs, dbg, ins = {}, {}, dict(mel=mel)
    captured = []
    orig = torch.randn_like
    def rec(x, *a, **k):
        y = orig(x, *a, **k); captured.append(y.clone()); return y
    with torch.no_grad():
        f0 = hift.f0_predictor(mel); outs['f0'] = f0
        torch.randn_like = rec
        try:
            torch.manual_seed(33)
            speech, source = hift.inference(speech_feat=mel)
            cache = source[:, :, -3840:] if source.shape[2] > 3840 else source[:, :, -480 * 4:]
            torch.manual_seed(34)
            speech_c, source_c = hift.inference(speech_feat=mel, cache_source=cache)
        finally:
            torch.randn_like = orig
        ins['sine_noise'] = captured[0]            # (1, 480T, 9) standard normal, used by SineGen2 (x noise_amp)
        ins['sine_noise_cached'] = captured[2]
        ins['cache_source'] = cache
        outs.update(speech=speech, source=source, speech_cached=speech_c, source_cached=source_c)
        outs['decode_given_source'] = hift.decode(x=mel, s=source)   # RNG-free path
    cfg = dict(base_channels=32, cond_channels=16, nb_harmonics=8, sampling_rate=24000, upsample_rates=[8, 5, 3],
               upsample_kernel_sizes=[16, 11, 7], n_fft=16, hop_len=4, resblock_kernel_sizes=[3, 7, 11],
               source_resblock_kernel_sizes=[7, 7, 11], dilations=[1, 3, 5], lrelu_slope=0.1, audio_limit=0.99,
               nsf_alpha=0.1, nsf_sigma=0.003, nsf_voiced_threshold=10, frames=T)
    save('hift_tiny', weights, ins, outs, cfg, dbg)


if __name__ == '__main__':
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        make_llm(tmp)
    make_flow()
    make_hift()
