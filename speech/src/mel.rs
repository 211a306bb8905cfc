//! Whisper's log-mel spectrogram, in Rust: 16 kHz, 25 ms Hann window (400), 10 ms hop (160),
//! 80 Slaney-scale mel bands, log10 clamped to 8 below the peak, scaled to about [-1, 1].
//!
//! Padding follows faster-whisper (the reference implementation of the same CTranslate2
//! weights), not openai-whisper: the audio gets 160 zero samples, the spectrogram covers only
//! the audio, and the 30 s window is filled with zeros *in the log-mel domain*. openai-whisper
//! pads the audio with 30 s of silence instead (silence = peak − 8 after the clamp). Measured on
//! espeak-ng clips: with openai-style padding Whisper base turned "The weather is nice today"
//! into "But wherever is ice today"; with this padding both agree word for word.

use std::sync::Arc;

use rustfft::{num_complex::Complex32, Fft, FftPlanner};

pub const SAMPLE_RATE: usize = 16_000;
pub const N_FFT: usize = 400;
pub const HOP: usize = 160;
pub const N_MELS: usize = 80;
/// Frames of one 30 s window.
pub const N_FRAMES: usize = 3000;
pub const WINDOW_SAMPLES: usize = N_FRAMES * HOP;

pub struct Mel {
    fft: Arc<dyn Fft<f32>>,
    window: Vec<f32>,
    /// [N_MELS][N_FFT/2 + 1]
    filters: Vec<Vec<f32>>,
}

fn hz_to_mel(f: f64) -> f64 {
    // Slaney: linear below 1 kHz, logarithmic above.
    let (f_sp, min_log_hz) = (200.0 / 3.0, 1000.0);
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if f >= min_log_hz {
        min_log_mel + (f / min_log_hz).ln() / logstep
    } else {
        f / f_sp
    }
}

fn mel_to_hz(m: f64) -> f64 {
    let (f_sp, min_log_hz) = (200.0 / 3.0, 1000.0);
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if m >= min_log_mel {
        min_log_hz * (logstep * (m - min_log_mel)).exp()
    } else {
        f_sp * m
    }
}

/// librosa.filters.mel(sr=16000, n_fft=400, n_mels=80) with Slaney normalisation.
fn mel_filters() -> Vec<Vec<f32>> {
    let n_bins = N_FFT / 2 + 1;
    let fft_freqs: Vec<f64> = (0..n_bins).map(|i| i as f64 * SAMPLE_RATE as f64 / N_FFT as f64).collect();
    let (lo, hi) = (hz_to_mel(0.0), hz_to_mel(SAMPLE_RATE as f64 / 2.0));
    let pts: Vec<f64> = (0..N_MELS + 2).map(|i| mel_to_hz(lo + (hi - lo) * i as f64 / (N_MELS + 1) as f64)).collect();
    (0..N_MELS)
        .map(|m| {
            let (l, c, r) = (pts[m], pts[m + 1], pts[m + 2]);
            let enorm = 2.0 / (r - l);
            fft_freqs
                .iter()
                .map(|&f| {
                    let up = (f - l) / (c - l);
                    let down = (r - f) / (r - c);
                    (up.min(down).max(0.0) * enorm) as f32
                })
                .collect()
        })
        .collect()
}

impl Default for Mel {
    fn default() -> Self {
        Mel::new()
    }
}

impl Mel {
    pub fn new() -> Mel {
        let fft = FftPlanner::new().plan_fft_forward(N_FFT);
        // Periodic Hann window.
        let window = (0..N_FFT)
            .map(|i| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / N_FFT as f64).cos()) as f32)
            .collect();
        Mel { fft, window, filters: mel_filters() }
    }

    /// log10 of the mel energies of the first `n_frames` frames (hop HOP, Hann window) of
    /// `padded` (already padded for a centred STFT), as [N_MELS × `width`] row-major with zeros
    /// after them, and the largest value (the clamp's reference).
    fn log_mel(&self, padded: &[f32], n_frames: usize, width: usize) -> (Vec<f32>, f32) {
        let n_bins = N_FFT / 2 + 1;
        let mut out = vec![0f32; N_MELS * width];
        let mut buf = vec![Complex32::new(0.0, 0.0); N_FFT];
        let mut power = vec![0f32; n_bins];
        let mut scratch = vec![Complex32::new(0.0, 0.0); self.fft.get_inplace_scratch_len()];
        let mut peak = f32::MIN;
        for frame in 0..n_frames {
            let start = frame * HOP;
            for (i, b) in buf.iter_mut().enumerate() {
                *b = Complex32::new(padded[start + i] * self.window[i], 0.0);
            }
            self.fft.process_with_scratch(&mut buf, &mut scratch);
            for (p, c) in power.iter_mut().zip(&buf[..n_bins]) {
                *p = c.norm_sqr();
            }
            for (m, filt) in self.filters.iter().enumerate() {
                let e: f32 = filt.iter().zip(&power).map(|(a, b)| a * b).sum();
                let v = e.max(1e-10).log10();
                peak = peak.max(v);
                out[m * width + frame] = v;
            }
        }
        (out, peak)
    }

    /// Log-mel of up to 30 s of 16 kHz mono samples, as [N_MELS × N_FRAMES] row-major.
    pub fn compute(&self, samples: &[f32]) -> Vec<f32> {
        self.compute_frames(samples, N_FRAMES)
    }

    /// The same over a window of `frames` (≤ N_FRAMES) instead of 30 s: the audio's frames,
    /// then zeros (the log-mel domain's padding) up to `frames`. The values are the 30 s
    /// window's first `frames` columns.
    pub fn compute_frames(&self, samples: &[f32], frames: usize) -> Vec<f32> {
        let frames = frames.min(N_FRAMES);
        let samples = &samples[..samples.len().min(frames * HOP)];
        let half = N_FFT / 2;
        // The audio + 160 zeros, reflect-padded by N_FFT/2 on both sides (centered STFT).
        let len = samples.len() + HOP;
        let mut padded = vec![0f32; len + N_FFT];
        padded[half..half + samples.len()].copy_from_slice(samples);
        for i in 0..half {
            padded[half - 1 - i] = padded[(half + 1 + i).min(half + len - 1)];
            padded[half + len + i] = padded[(half + len).saturating_sub(2 + i).max(half)];
        }
        // numpy's STFT gives len/HOP + 1 frames; the last is dropped.
        let n_frames = (len / HOP).min(frames);
        let (mut out, peak) = self.log_mel(&padded, n_frames, frames);
        // faster-whisper then treats all but the last frame as content (`content_frames =
        // n_frames - 1`) and zero-fills the window after it.
        let content = n_frames.saturating_sub(1);
        for m in 0..N_MELS {
            let row = &mut out[m * frames..(m + 1) * frames];
            for (i, v) in row.iter_mut().enumerate() {
                *v = if i < content { (v.max(peak - 8.0) + 4.0) / 4.0 } else { 0.0 };
            }
        }
        out
    }
}

/// Samples the end-of-turn model hears: the last 8 s.
pub const TURN_SAMPLES: usize = 8 * SAMPLE_RATE;
/// Frames of its window.
pub const TURN_FRAMES: usize = TURN_SAMPLES / HOP;

impl Mel {
    /// Smart Turn's features, as [N_MELS × TURN_FRAMES] row-major: Pipecat's numpy copy of
    /// `WhisperFeatureExtractor(chunk_length=8)`, which differs from [`Mel::compute`] on
    /// purpose. The last 8 s are kept, shorter audio is zero-padded at the *front*; the
    /// waveform is normalised to zero mean and unit variance over the whole window (padding
    /// included) before the STFT; the STFT is reflect-padded with no extra zeros, its last frame
    /// dropped; the clamp at peak − 8 runs over the whole window.
    pub fn smart_turn(&self, samples: &[f32]) -> Vec<f32> {
        let tail = &samples[samples.len().saturating_sub(TURN_SAMPLES)..];
        let mut x = vec![0f32; TURN_SAMPLES];
        x[TURN_SAMPLES - tail.len()..].copy_from_slice(tail);
        let n = TURN_SAMPLES as f64;
        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = x.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n;
        let scale = 1.0 / (var + 1e-7).sqrt();
        for v in &mut x {
            *v = ((f64::from(*v) - mean) * scale) as f32;
        }
        // numpy's reflect padding: x[half], …, x[1] before; x[n-2], … after.
        let half = N_FFT / 2;
        let mut padded = vec![0f32; TURN_SAMPLES + N_FFT];
        padded[half..half + TURN_SAMPLES].copy_from_slice(&x);
        for j in 0..half {
            padded[j] = x[half - j];
            padded[half + TURN_SAMPLES + j] = x[TURN_SAMPLES - 2 - j];
        }
        // 801 frames; the 801st is dropped.
        let (mut out, peak) = self.log_mel(&padded, TURN_FRAMES, TURN_FRAMES);
        for v in &mut out {
            *v = (v.max(peak - 8.0) + 4.0) / 4.0;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_match_librosa_slaney_shape() {
        let f = mel_filters();
        assert_eq!((f.len(), f[0].len()), (80, 201));
        // Every band has weight, bands are normalised by their width (Slaney): the low,
        // narrow bands weigh more per bin than the high, wide ones.
        assert!(f.iter().all(|b| b.iter().any(|&w| w > 0.0)));
        let peak = |b: &Vec<f32>| b.iter().cloned().fold(0f32, f32::max);
        assert!(peak(&f[0]) > peak(&f[79]));
    }

    #[test]
    fn a_tone_lights_its_band_and_silence_is_flat() {
        let mel = Mel::new();
        let tone: Vec<f32> = (0..SAMPLE_RATE)
            .map(|i| (2.0 * std::f32::consts::PI * 440.0 * i as f32 / SAMPLE_RATE as f32).sin() * 0.5)
            .collect();
        let m = mel.compute(&tone);
        assert_eq!(m.len(), N_MELS * N_FRAMES);
        // Frame 50 (0.5 s): the band holding 440 Hz is the loudest.
        let col: Vec<f32> = (0..N_MELS).map(|b| m[b * N_FRAMES + 50]).collect();
        let best = col.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
        let hz = mel_to_hz(hz_to_mel(0.0) + (hz_to_mel(8000.0) - hz_to_mel(0.0)) * (best + 1) as f64 / 81.0);
        assert!((300.0..600.0).contains(&hz), "band {best} centred at {hz} Hz");
        assert!(m.iter().all(|v| (-1.5..=1.5).contains(v)));
    }

    #[test]
    fn smart_turn_features_keep_the_last_8_s_padded_at_the_front() {
        let mel = Mel::new();
        let tone = |n: usize| -> Vec<f32> {
            // Periodic over each second (440 whole cycles), so any whole second is the same samples.
            (0..n)
                .map(|i| {
                    (2.0 * std::f32::consts::PI * 440.0 * (i % SAMPLE_RATE) as f32 / SAMPLE_RATE as f32).sin() * 0.5
                })
                .collect()
        };
        // 1 s of tone: the front 7 s are padding (all one value), the last second is not.
        let short = mel.smart_turn(&tone(SAMPLE_RATE));
        assert_eq!(short.len(), N_MELS * TURN_FRAMES);
        let band = |f: &[f32], b: usize, frame: usize| f[b * TURN_FRAMES + frame];
        assert_eq!(band(&short, 10, 0), band(&short, 10, 600));
        assert!(band(&short, 10, 790) > band(&short, 10, 0));
        // 10 s: only the last 8 are heard, so 2 s of silence in front of 10 s of tone is the
        // same as the tone alone.
        let mut long = vec![0.0; 2 * SAMPLE_RATE];
        long.extend(tone(10 * SAMPLE_RATE));
        assert_eq!(mel.smart_turn(&long), mel.smart_turn(&tone(10 * SAMPLE_RATE)));
        // Clamped at the window's peak − 8 (in log10), then divided by 4: a spread of 2 at most.
        let (lo, hi) = short.iter().fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        assert!(short.iter().all(|v| v.is_finite()) && hi - lo <= 2.0 + 1e-5, "{lo}..{hi}");
    }

    #[test]
    fn a_shorter_window_is_the_30_s_windows_first_columns() {
        let mel = Mel::new();
        let tone: Vec<f32> = (0..2 * SAMPLE_RATE)
            .map(|i| (2.0 * std::f32::consts::PI * 440.0 * i as f32 / SAMPLE_RATE as f32).sin() * 0.5)
            .collect();
        let (full, short) = (mel.compute(&tone), mel.compute_frames(&tone, 500));
        assert_eq!(short.len(), N_MELS * 500);
        for m in 0..N_MELS {
            assert_eq!(&short[m * 500..(m + 1) * 500], &full[m * N_FRAMES..m * N_FRAMES + 500]);
        }
    }
}
