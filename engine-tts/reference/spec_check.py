"""Independent re-implementation of the brief's formulas (plain torch ops, no reference modules),
checked against the fixtures made by make_cosyvoice2_fixtures.py."""
import json, math, sys
import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
torch.set_num_threads(1)
OUT = sys.argv[1] if len(sys.argv) > 1 else 'out'

def load(name):
    d = {}
    with safe_open(f'{OUT}/{name}.safetensors', 'pt') as f:
        cfg = json.loads(f.metadata()['config'])
        for k in f.keys():
            d[k] = f.get_tensor(k)
    W = {k[2:]: v for k, v in d.items() if k.startswith('w.')}
    I = {k[3:]: v for k, v in d.items() if k.startswith('in.')}
    O = {k[4:]: v for k, v in d.items() if k.startswith('out.')}
    return W, I, O, cfg

def report(name, a, b):
    a, b = a.clamp(min=-1e30), b.clamp(min=-1e30)
    err = (a - b).abs().max().item(); scale = b.abs().max().item()
    print(f'{name:32s} max|diff| {err:.3e}  (max|ref| {scale:.3e})  shape {tuple(b.shape)}')

def lin(x, W, p, bias=True):
    y = x @ W[p + '.weight'].T
    return y + W[p + '.bias'] if bias and (p + '.bias') in W else y

def ln(x, W, p, eps):
    return F.layer_norm(x, x.shape[-1:], W[p + '.weight'], W[p + '.bias'], eps)

# ============================================================ LLM (Qwen2 + heads)
def qwen2(x, W, c, cache=None):
    """x (1,L,H) embeddings; cache list of (k,v) per layer or None. Returns final-normed hidden, cache."""
    H, nh, nkv = c['hidden_size'], c['num_attention_heads'], c['num_key_value_heads']; hd = H // nh
    L = x.shape[1]; past = 0 if cache is None else cache[0][0].shape[2]
    pos = torch.arange(past, past + L, dtype=torch.float32)
    inv = 1.0 / (c['rope_theta'] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    fr = pos[:, None] * inv[None]; emb = torch.cat([fr, fr], -1); cos, sin = emb.cos(), emb.sin()
    rot = lambda t: torch.cat([-t[..., hd // 2:], t[..., :hd // 2]], -1)
    new = []
    for i in range(c['num_hidden_layers']):
        p = f'llm.model.model.layers.{i}.'
        def rms(t, w):
            return w * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + c['rms_norm_eps']))
        h = rms(x, W[p + 'input_layernorm.weight'])
        q = lin(h, W, p + 'self_attn.q_proj').view(1, L, nh, hd).transpose(1, 2)
        k = lin(h, W, p + 'self_attn.k_proj').view(1, L, nkv, hd).transpose(1, 2)
        v = lin(h, W, p + 'self_attn.v_proj').view(1, L, nkv, hd).transpose(1, 2)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        if cache is not None:
            k = torch.cat([cache[i][0], k], 2); v = torch.cat([cache[i][1], v], 2)
        new.append((k, v))
        k = k.repeat_interleave(nh // nkv, 1); v = v.repeat_interleave(nh // nkv, 1)
        s = q @ k.transpose(-1, -2) / math.sqrt(hd)
        T = k.shape[2]; causal = torch.arange(T)[None, :] <= (torch.arange(L)[:, None] + past)
        s = s.masked_fill(~causal, float('-inf'))
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(1, L, H)
        x = x + a @ W[p + 'self_attn.o_proj.weight'].T
        h = rms(x, W[p + 'post_attention_layernorm.weight'])
        m = F.silu(h @ W[p + 'mlp.gate_proj.weight'].T) * (h @ W[p + 'mlp.up_proj.weight'].T)
        x = x + m @ W[p + 'mlp.down_proj.weight'].T
    x = rms(x, W['llm.model.model.norm.weight'])
    return x, new

def nucleus_set(logp, top_p, top_k):
    prob = logp.softmax(0)
    val, idx = prob.sort(descending=True, stable=True)
    cum, ps, ids = torch.tensor(0.0), [], []
    for i in range(len(idx)):
        if cum < top_p and len(ps) < top_k:
            cum = cum + val[i]; ps.append(val[i].item()); ids.append(idx[i].item())
        else:
            break
    return ids, ps

def pick(ps, u):
    p = np.array(ps, dtype=np.float64); cdf = np.cumsum(p / p.sum())
    return int(min(np.searchsorted(cdf, u, side='right'), len(p) - 1))

def ras(logp, decoded, uniforms, c):
    ids, ps = nucleus_set(logp, c['top_p'], c['top_k'])
    top = ids[pick(ps, uniforms.pop(0))]
    if sum(1 for t in decoded[-c['win_size']:] if t == top) >= c['win_size'] * c['tau_r']:
        logp = logp.clone(); logp[top] = float('-inf')
        top = pick(logp.softmax(0).tolist(), uniforms.pop(0))
    return top

def check_llm():
    W, I, O, c = load('llm_tiny'); q = c['qwen2']; S = c['speech_token_size']
    E = W['llm.model.model.embed_tokens.weight']; SE = W['speech_embedding.weight']; LE = W['llm_embedding.weight']
    dec = lambda h: (h @ W['llm_decoder.weight'].T + W['llm_decoder.bias']).log_softmax(-1)
    text = torch.cat([I['prompt_text'], I['text']], 1)[0]
    base = torch.cat([LE[0:1], E[text], LE[1:2], SE[I['prompt_speech_token'][0]]], 0)[None]
    x = torch.cat([base, SE[I['teacher_speech_token'][0]][None]], 1)
    h, _ = qwen2(x, W, q)
    report('llm teacher-forced logp', dec(h), O['teacher_logp'])
    # unistream decode with KV cache + RAS driven by recorded uniforms
    n_text = I['text'].shape[1]; min_len, max_len = int(n_text * 2), int(n_text * 20)
    u = I['unistream_uniforms'].tolist(); out, cache, inp, scores = [], None, base, []
    for i in range(max_len):
        h, cache = qwen2(inp, W, q, cache)
        lp = dec(h[0, -1])
        if i < min_len:
            lp[S] = float('-inf')
        scores.append(lp.clone())
        t = ras(lp, out, u, c)
        if t in (S, S + 1, S + 2):
            break
        out.append(t); inp = SE[t][None, None]
    report('llm unistream step scores', torch.stack(scores), O['unistream_step_scores'])
    print('llm unistream tokens equal:', out == O['unistream_tokens'].tolist())
    # bistream: text arrives one token at a time; mix 5 text : 15 speech; fill token S+2
    n_mix_t, n_mix_s = c['mix_ratio']; fill, eos = S + 2, S
    u = I['bistream_uniforms'].tolist(); out, cache, scores = [], None, []
    prompt_sp = SE[I['prompt_speech_token'][0]]; text_cache = E[I['prompt_text'][0]]
    inp = LE[0:1]
    nP = I['prompt_speech_token'].shape[1]; next_fill = (nP // n_mix_s + 1) * n_mix_s - nP
    def step(inp, cache):
        h, cache = qwen2(inp[None], W, q, cache); return dec(h[0, -1]), cache
    for tok in I['text'][0].tolist():
        text_cache = torch.cat([text_cache, E[tok][None]], 0)
        while prompt_sp.shape[0] > 0 and text_cache.shape[0] >= n_mix_t:
            inp = torch.cat([inp, text_cache[:n_mix_t], prompt_sp[:n_mix_s]], 0)
            text_cache, prompt_sp = text_cache[n_mix_t:], prompt_sp[n_mix_s:]
        if prompt_sp.shape[0] != 0:
            continue
        if (out and out[-1] == fill) or (not out and inp.shape[0] == 1):
            if text_cache.shape[0] < n_mix_t:
                continue
            inp = text_cache[:n_mix_t] if (out and out[-1] == fill) else torch.cat([inp, text_cache[:n_mix_t]], 0)
            text_cache = text_cache[n_mix_t:]
        while True:
            lp, cache = step(inp, cache)
            if len(out) == next_fill:
                t = fill; next_fill += n_mix_s + 1
            else:
                lp[eos] = float('-inf'); scores.append(lp.clone()); t = ras(lp, out, u, c)
            if t == fill:
                next_fill = len(out) + n_mix_s + 1
            out.append(t)
            if t == fill:
                break
            inp = SE[t][None]
    inp = torch.cat([inp, text_cache, LE[1:2]], 0)
    while True:
        lp, cache = step(inp, cache); scores.append(lp.clone()); t = ras(lp, out, u, c); out.append(t)
        if t == eos:
            break
        inp = SE[t][None]
    speech_only = [t for t in out if t < S]
    report('llm bistream step scores', torch.stack(scores), O['bistream_step_scores'])
    print('llm bistream tokens equal:', speech_only == O['bistream_tokens'].tolist(), 'uniforms left', len(u))

# ============================================================ flow
def rel_pe(L, D):
    p = torch.arange(L - 1, -L, -1, dtype=torch.float32)[:, None]       # relative positions L-1 ... -(L-1)
    div = torch.exp(torch.arange(0, D, 2, dtype=torch.float32) * -(math.log(10000.0) / D))
    pe = torch.zeros(2 * L - 1, D); pe[:, 0::2] = torch.sin(p * div); pe[:, 1::2] = torch.cos(p * div)
    return pe

def chunk_mask(L, chunk):
    if chunk <= 0:
        return torch.ones(L, L, dtype=torch.bool)
    i = torch.arange(L); return i[None, :] < ((i // chunk + 1) * chunk)[:, None]

def conformer(x, W, p, heads, mask, pe):
    B, L, D = x.shape; dk = D // heads
    r = x; h = ln(x, W, p + 'norm_mha', 1e-12)
    q = lin(h, W, p + 'self_attn.linear_q').view(B, L, heads, dk)
    k = lin(h, W, p + 'self_attn.linear_k').view(B, L, heads, dk).transpose(1, 2)
    v = lin(h, W, p + 'self_attn.linear_v').view(B, L, heads, dk).transpose(1, 2)
    P = (pe @ W[p + 'self_attn.linear_pos.weight'].T).view(2 * L - 1, heads, dk).transpose(0, 1)   # (H, 2L-1, dk)
    ac = (q + W[p + 'self_attn.pos_bias_u']).transpose(1, 2) @ k.transpose(-1, -2)
    bdf = (q + W[p + 'self_attn.pos_bias_v']).transpose(1, 2) @ P.transpose(-1, -2)                 # (B,H,L,2L-1)
    idx = (L - 1 - torch.arange(L))[:, None] + torch.arange(L)[None, :]                             # i,j -> L-1-i+j
    bd = torch.gather(bdf, 3, idx[None, None].expand(B, heads, L, L))
    s = ((ac + bd) / math.sqrt(dk)).masked_fill(~mask, float('-inf'))
    a = s.softmax(-1).masked_fill(~mask, 0.0)
    x = r + lin((a @ v).transpose(1, 2).reshape(B, L, D), W, p + 'self_attn.linear_out')
    h = ln(x, W, p + 'norm_ff', 1e-12)
    return x + lin(F.silu(lin(h, W, p + 'feed_forward.w_1')), W, p + 'feed_forward.w_2')

def encoder(x, W, c, streaming, context=None):
    D = c['D']; pre = 'encoder.'
    emb = lambda t, p: ln(lin(t, W, p + '.out.0'), W, p + '.out.1', 1e-5) * math.sqrt(D)
    h = emb(x, pre + 'embed'); L = h.shape[1]
    y = h.transpose(1, 2)
    ctx = emb(context, pre + 'embed').transpose(1, 2) if context is not None else torch.zeros(1, D, 0)
    y = F.pad(torch.cat([y, ctx], 2), (0, 3 - ctx.shape[2]))
    y = F.leaky_relu(F.conv1d(y, W[pre + 'pre_lookahead_layer.conv1.weight'], W[pre + 'pre_lookahead_layer.conv1.bias']), 0.01)
    y = F.conv1d(F.pad(y, (2, 0)), W[pre + 'pre_lookahead_layer.conv2.weight'], W[pre + 'pre_lookahead_layer.conv2.bias'])
    h = y.transpose(1, 2) + h
    m = chunk_mask(L, c['static_chunk_size'] if streaming else 0); pe = rel_pe(L, D)
    for i in range(c['num_blocks']):
        h = conformer(h, W, pre + f'encoders.{i}.', c['heads'], m, pe)
    y = h.transpose(1, 2).repeat_interleave(2, 2)
    y = F.conv1d(F.pad(y, (4, 0)), W[pre + 'up_layer.conv.weight'], W[pre + 'up_layer.conv.bias'])
    h = emb(y.transpose(1, 2), pre + 'up_embed'); L = h.shape[1]
    m = chunk_mask(L, 2 * c['static_chunk_size'] if streaming else 0); pe = rel_pe(L, D)
    for i in range(c['up_blocks']):
        h = conformer(h, W, pre + f'up_encoders.{i}.', c['heads'], m, pe)
    return ln(h, W, pre + 'after_norm', 1e-5)

def causal_conv(x, W, p, k_pad=2):
    return F.conv1d(F.pad(x, (k_pad, 0)), W[p + '.weight'], W[p + '.bias'])

def block(x, mask, W, p):      # CausalBlock1D
    y = causal_conv(x * mask, W, p + '.block.0')
    y = F.layer_norm(y.transpose(1, 2), y.shape[1:2], W[p + '.block.2.weight'], W[p + '.block.2.bias'], 1e-5).transpose(1, 2)
    return F.mish(y) * mask

def resnet(x, mask, temb, W, p):
    h = block(x, mask, W, p + '.block1') + lin(F.mish(temb), W, p + '.mlp.1')[:, :, None]
    h = block(h, mask, W, p + '.block2')
    return h + F.conv1d(x * mask, W[p + '.res_conv.weight'], W[p + '.res_conv.bias'])

def tblock(x, bias, W, p, heads, hd):
    B, T, C = x.shape
    h = F.layer_norm(x, (C,), W[p + '.norm1.weight'], W[p + '.norm1.bias'], 1e-5)
    q, k, v = [(h @ W[p + f'.attn1.to_{n}.weight'].T).view(B, T, heads, hd).transpose(1, 2) for n in 'qkv']
    s = q @ k.transpose(-1, -2) / math.sqrt(hd) + bias[:, None]
    a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, heads * hd)
    x = x + lin(a, W, p + '.attn1.to_out.0')
    h = F.layer_norm(x, (C,), W[p + '.norm3.weight'], W[p + '.norm3.bias'], 1e-5)
    return x + lin(F.gelu(lin(h, W, p + '.ff.net.0.proj')), W, p + '.ff.net.2')

def estimator(x, mask, mu, t, spks, cond, W, c, streaming):
    p = 'decoder.estimator.'; heads, hd = c['num_heads'], c['attention_head_dim']
    half = 160; e = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000) / (half - 1)))
    a = 1000 * t[:, None] * e[None]; temb = torch.cat([a.sin(), a.cos()], -1)
    temb = lin(F.silu(lin(temb, W, p + 'time_mlp.linear_1')), W, p + 'time_mlp.linear_2')
    T = x.shape[2]
    h = torch.cat([x, mu, spks[:, :, None].expand(-1, -1, T), cond], 1)
    m = chunk_mask(T, c['decoder_static_chunk_size'] if streaming else 0)[None] & mask.bool().transpose(1, 2).transpose(1, 2).expand(-1, T, -1)
    bias = (1.0 - m.float()) * -1.0e10
    def stage(h, q):
        h = resnet(h, mask, temb, W, q + '.0')
        h = h.transpose(1, 2)
        for j in range(c['n_blocks']):
            h = tblock(h, bias, W, q + f'.1.{j}', heads, hd)
        return h.transpose(1, 2)
    h = stage(h, p + 'down_blocks.0'); skip = h
    h = causal_conv(h * mask, W, p + 'down_blocks.0.2')
    for i in range(c['num_mid_blocks']):
        h = stage(h, p + f'mid_blocks.{i}')
    h = stage(torch.cat([h[:, :, :skip.shape[2]], skip], 1), p + 'up_blocks.0')
    h = causal_conv(h * mask, W, p + 'up_blocks.0.2')
    h = block(h, mask, W, p + 'final_block')
    return F.conv1d(h * mask, W[p + 'final_proj.weight'], W[p + 'final_proj.bias']) * mask

def flow_infer(W, I, c, tokens, streaming, finalize):
    P = I['prompt_token'].shape[1]
    spk = F.normalize(I['embedding'], dim=1) @ W['spk_embed_affine_layer.weight'].T + W['spk_embed_affine_layer.bias']
    x = W['input_embedding.weight'][torch.cat([I['prompt_token'], tokens], 1)[0]][None]
    h = encoder(x, W, c, streaming) if finalize else encoder(x[:, :-3], W, c, streaming, context=x[:, -3:])
    mu = lin(h, W, 'encoder_proj').transpose(1, 2); T = mu.shape[2]; m1 = 2 * P
    cond = torch.zeros(1, 80, T); cond[:, :, :m1] = I['prompt_feat'].transpose(1, 2)
    mask = torch.ones(1, 1, T); z = I['rand_noise'][:, :, :T].clone()
    ts = 1 - torch.cos(torch.linspace(0, 1, c['n_timesteps'] + 1) * 0.5 * torch.pi)
    t, dt = ts[0:1], ts[1] - ts[0]
    zeros = torch.zeros_like
    for step in range(1, len(ts)):
        v = estimator(torch.cat([z, z]), torch.cat([mask, mask]), torch.cat([mu, zeros(mu)]), torch.cat([t, t]),
                      torch.cat([spk, zeros(spk)]), torch.cat([cond, zeros(cond)]), W, c, streaming)
        v = (1.0 + c['inference_cfg_rate']) * v[:1] - c['inference_cfg_rate'] * v[1:]
        z = z + dt * v; t = t + dt
        if step < len(ts) - 1:
            dt = ts[step + 1] - t
    return z[:, :, m1:]

def check_flow():
    W, I, O, c = load('flow_tiny')
    x = W['input_embedding.weight'][torch.cat([I['prompt_token'], I['token']], 1)[0]][None]
    for s in (0, 1):
        report(f'flow encoder full stream{s}', encoder(x, W, c, bool(s)), O[f'encoder_full_stream{s}'])
        report(f'flow encoder ctx stream{s}', encoder(x[:, :-3], W, c, bool(s), x[:, -3:]), O[f'encoder_ctx_stream{s}'])
        report(f'flow estimator stream{s}', estimator(I['est_x'], I['est_mask'], I['est_mu'], I['est_t'], I['est_spks'],
                                                     I['est_cond'], W, c, bool(s)), O[f'estimator_stream{s}'])
    report('flow mel offline', flow_infer(W, I, c, I['token'], False, True), O['mel_offline'])
    off = 0
    for i, hop in enumerate(O['stream_hops'].tolist()):
        m = flow_infer(W, I, c, I['token'][:, :off + hop + 3], True, False)[:, :, 2 * off:]
        report(f'flow mel stream chunk{i}', m, O[f'mel_stream_chunk{i}']); off += hop
    m = flow_infer(W, I, c, I['token'], False, True)[:, :, 2 * off:]
    report(f'flow mel final chunk', m, O[f'mel_stream_chunk{len(O["stream_hops"])}'])

# ============================================================ HiFT
def wn(W, p):
    if p + '.parametrizations.weight.original0' in W:
        g, v = W[p + '.parametrizations.weight.original0'], W[p + '.parametrizations.weight.original1']
        return g * v / v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
    return W[p + '.weight']

def snake(x, a):
    a = a[None, :, None]; return x + 1.0 / (a + 1e-9) * torch.sin(x * a) ** 2

def resblock(x, W, p, k, dil=(1, 3, 5)):
    for i, d in enumerate(dil):
        xt = snake(x, W[f'{p}.activations1.{i}.alpha'])
        xt = F.conv1d(xt, wn(W, f'{p}.convs1.{i}'), W[f'{p}.convs1.{i}.bias'], dilation=d, padding=d * (k - 1) // 2)
        xt = snake(xt, W[f'{p}.activations2.{i}.alpha'])
        xt = F.conv1d(xt, wn(W, f'{p}.convs2.{i}'), W[f'{p}.convs2.{i}.bias'], padding=(k - 1) // 2)
        x = xt + x
    return x

HANN16 = torch.tensor([0.5 - 0.5 * math.cos(2 * math.pi * n / 16) for n in range(16)], dtype=torch.float32)

def stft16(s):     # s (B, N) -> real, imag (B, 9, N/4+1)
    xp = F.pad(s[:, None], (8, 8), mode='reflect')[:, 0]
    fr = xp.unfold(1, 16, 4) * HANN16                              # (B, F, 16)
    n = torch.arange(16, dtype=torch.float64); k = torch.arange(9, dtype=torch.float64)
    ang = 2 * math.pi * k[:, None] * n[None] / 16
    re = (fr.double() @ torch.cos(ang).T).float().transpose(1, 2); im = (-(fr.double() @ torch.sin(ang).T)).float().transpose(1, 2)
    return re, im

def istft16(re, im):   # (B, 9, F) -> (B, 4(F-1))
    B, _, Fr = re.shape
    n = torch.arange(16, dtype=torch.float64); k = torch.arange(9, dtype=torch.float64)
    c = torch.full((9,), 2.0, dtype=torch.float64); c[0] = c[8] = 1.0     # hermitian weights; DC/Nyquist imag ignored
    ang = 2 * math.pi * k[:, None] * n[None] / 16
    fr = (c[None, :, None, None] * (re.double()[..., None] * torch.cos(ang)[None, :, None] - im.double()[..., None] * torch.sin(ang)[None, :, None])).sum(1) / 16
    fr = fr * HANN16.double()                                           # (B, F, 16)
    N = 4 * (Fr - 1) + 16
    y = torch.zeros(B, N, dtype=torch.float64); env = torch.zeros(N, dtype=torch.float64)
    for f in range(Fr):
        y[:, 4 * f:4 * f + 16] += fr[:, f]; env[4 * f:4 * f + 16] += HANN16.double() ** 2
    return (y / env)[:, 8:8 + 4 * (Fr - 1)].float()

def lin_up(x, scale):   # F.interpolate(mode='linear', align_corners=False, scale_factor=scale) on last dim, scale integer
    T = x.shape[-1]; j = torch.arange(T * scale, dtype=torch.float32)
    src = torch.clamp(torch.tensor(1.0 / scale, dtype=torch.float32) * (j + 0.5) - 0.5, min=0)
    i0 = src.long(); i1 = torch.clamp(i0 + 1, max=T - 1); l1 = src - i0; l0 = 1 - l1
    return x[..., i0] * l0 + x[..., i1] * l1

def source(f0, noise, W):    # f0 (B,T); noise (B, 480T, 9)
    T = f0.shape[1]
    rad = (f0[:, :, None] * torch.arange(1, 10, dtype=torch.float32) / 24000) % 1        # per frame (B,T,9)
    phase = (torch.cumsum(rad.double(), 1).float() * 2 * np.pi)                          # (B,T,9)
    phase = lin_up(phase.transpose(1, 2) * 480, 480).transpose(1, 2)                     # (B,480T,9)
    sines = torch.sin(phase) * 0.1
    uv = (f0.repeat_interleave(480, 1)[:, :, None] > 10).float()
    amp = uv * 0.003 + (1 - uv) * 0.1 / 3
    sw = sines * uv + amp * noise
    return torch.tanh(lin(sw, W, 'm_source.l_linear')).transpose(1, 2)                  # (B,1,480T)

def decode(mel, s, W, c):
    re, im = stft16(s[:, 0]); sst = torch.cat([re, im], 1)
    x = F.conv1d(mel, wn(W, 'conv_pre'), W['conv_pre.bias'], padding=3)
    ups, ks = c['upsample_rates'], c['upsample_kernel_sizes']
    cum = np.cumprod([1] + ups[::-1][:-1])[::-1]
    for i in range(3):
        x = F.leaky_relu(x, 0.1)
        x = F.conv_transpose1d(x, wn(W, f'ups.{i}'), W[f'ups.{i}.bias'], stride=ups[i], padding=(ks[i] - ups[i]) // 2)
        if i == 2:
            x = F.pad(x, (1, 0), mode='reflect')
        u = int(cum[i])
        si = F.conv1d(sst, W[f'source_downs.{i}.weight'], W[f'source_downs.{i}.bias'], stride=u, padding=u // 2 if u > 1 else 0)
        x = x + resblock(si, W, f'source_resblocks.{i}', c['source_resblock_kernel_sizes'][i])
        x = sum(resblock(x, W, f'resblocks.{3 * i + j}', c['resblock_kernel_sizes'][j]) for j in range(3)) / 3
    x = F.conv1d(F.leaky_relu(x, 0.01), wn(W, 'conv_post'), W['conv_post.bias'], padding=3)
    mag = torch.clamp(torch.exp(x[:, :9]), max=100.0); ph = torch.sin(x[:, 9:])
    return torch.clamp(istft16(mag * torch.cos(ph), mag * torch.sin(ph)), -0.99, 0.99)

def check_hift():
    W, I, O, c = load('hift_tiny')
    h = I['mel']
    for i in (0, 2, 4, 6, 8):
        h = F.elu(F.conv1d(h, wn(W, f'f0_predictor.condnet.{i}'), W[f'f0_predictor.condnet.{i}.bias'], padding=1))
    f0 = lin(h.transpose(1, 2), W, 'f0_predictor.classifier')[..., 0].abs()
    report('hift f0', f0, O['f0'])
    s = source(f0, I['sine_noise'], W); report('hift source', s, O['source'])
    report('hift decode(source)', decode(I['mel'], O['source'], W, c), O['decode_given_source'])
    report('hift speech', decode(I['mel'], s, W, c), O['speech'])
    s2 = source(f0, I['sine_noise_cached'], W); s2[:, :, :I['cache_source'].shape[2]] = I['cache_source']
    report('hift source (cached)', s2, O['source_cached'])
    report('hift speech (cached)', decode(I['mel'], s2, W, c), O['speech_cached'])

if __name__ == '__main__':
    with torch.no_grad():
        check_llm(); check_flow(); check_hift()
