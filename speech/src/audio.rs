//! Audio in and out: WAV files (any rate, any channels, 16-bit or float) to 16 kHz mono f32,
//! and PCM s16le from socket frames.

use std::path::Path;

use crate::runtime::SpeechError;

/// The sample rates taken (a socket turn's too): 0 divided by zero, 1 Hz asked for 16,000
/// samples per sample, and over 384 kHz nothing is audio.
pub const RATES: std::ops::RangeInclusive<u32> = 8_000..=384_000;

/// Read a WAV file as 16 kHz mono samples in [-1, 1]. A rate outside [`RATES`] or a float
/// sample that is not a number is an error (one NaN poisoned the VAD's state for the rest of
/// the file); float samples past ±1 are clipped, as a microphone would.
pub fn read_wav(path: &Path) -> Result<Vec<f32>, SpeechError> {
    let mut r = hound::WavReader::open(path).map_err(|e| SpeechError::Audio(format!("{}: {e}", path.display())))?;
    let spec = r.spec();
    if !RATES.contains(&spec.sample_rate) {
        let (lo, hi) = (RATES.start(), RATES.end());
        let msg = format!("{}: sample rate {} Hz (from {lo} to {hi} are read)", path.display(), spec.sample_rate);
        return Err(SpeechError::Audio(msg));
    }
    let raw: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Float => r.samples::<f32>().collect::<Result<_, _>>(),
        // An extensible header's valid bits are taken as written (1 to 65535): past 32 the
        // scale's shift overflowed.
        hound::SampleFormat::Int if !(1..=32).contains(&spec.bits_per_sample) => {
            let msg = format!("{}: {}-bit samples (from 1 to 32 are read)", path.display(), spec.bits_per_sample);
            return Err(SpeechError::Audio(msg));
        }
        hound::SampleFormat::Int => {
            let scale = 1.0 / (1u64 << (spec.bits_per_sample - 1)) as f32;
            r.samples::<i32>().map(|s| s.map(|v| v as f32 * scale)).collect::<Result<_, _>>()
        }
    }
    .map_err(|e| SpeechError::Audio(format!("{}: {e}", path.display())))?;
    if let Some(i) = raw.iter().position(|v| !v.is_finite()) {
        return Err(SpeechError::Audio(format!("{}: sample {i} is not a number", path.display())));
    }
    let raw: Vec<f32> = raw.into_iter().map(|v| v.clamp(-1.0, 1.0)).collect();
    Ok(to_16k_mono(&raw, spec.sample_rate, spec.channels))
}

/// Interleaved samples at `rate` with `channels` → 16 kHz mono (channel mean, then
/// [`resample`]; speech has nothing above 8 kHz worth keeping for Whisper).
pub fn to_16k_mono(interleaved: &[f32], rate: u32, channels: u16) -> Vec<f32> {
    resample(&mono(interleaved, channels), rate, 16_000)
}

/// Interleaved samples → their channels' mean.
pub fn mono(interleaved: &[f32], channels: u16) -> Vec<f32> {
    let ch = channels.max(1) as usize;
    interleaved.chunks_exact(ch).map(|f| f.iter().sum::<f32>() / ch as f32).collect()
}

/// A whole signal at `from` Hz → `to` Hz: `len × to / from` samples (see [`Resampler`]).
pub fn resample(x: &[f32], from: u32, to: u32) -> Vec<f32> {
    if from == to || x.is_empty() {
        return x.to_vec();
    }
    Resampler::new(from, to).push(x, true)
}

/// A stream's resampler: windowed-sinc interpolation low-passed below the lower rate's Nyquist
/// frequency (a polyphase table), its position and the input it still reads carried from one
/// block to the next. Each socket frame was resampled on its own, linearly: a fraction of a
/// sample lost at every frame (1% of 44.1 kHz audio in 64-sample frames, all of it in frames
/// under 3 samples at 48 kHz), the phase reset at each, and 48 kHz decimated by 3 with no
/// filter (8-24 kHz noise folded into the speech band).
pub struct Resampler {
    /// The rates: output sample `i` is at input position `i × from / to`, kept in integers
    /// (a float step lost a sample of the total at odd rates).
    from: u64,
    to: u64,
    /// Input samples on each side of an output sample's position that the filter reads.
    half: usize,
    /// `PHASES` rows of `2 * half` taps: row `p` for an output `p / PHASES` of a sample past an
    /// input sample.
    table: Vec<f32>,
    /// The input still read, starting at input index `base`.
    input: Vec<f32>,
    base: usize,
    /// The next output sample's index, and the input samples seen.
    next: u64,
    seen: u64,
}

/// Zero crossings of the low-passed sinc on each side. With the Blackman window, at 48 kHz to
/// 16 kHz: -2 dB at 7 kHz, -24 dB at 8 kHz (the new Nyquist), -61 dB at 8.5 kHz.
const ZEROS: f64 = 16.0;
/// Positions between two input samples the filter is tabulated at.
const PHASES: usize = 256;

impl Resampler {
    pub fn new(from: u32, to: u32) -> Resampler {
        let (from, to) = (u64::from(from), u64::from(to));
        let mut r = Resampler { from, to, half: 0, table: Vec::new(), input: Vec::new(), base: 0, next: 0, seen: 0 };
        if from == to {
            return r;
        }
        // The cutoff, as a fraction of the input's Nyquist frequency: below the lower rate's,
        // with a margin for the transition band.
        let cutoff = (to as f64 / from as f64).min(1.0) * 0.92;
        r.half = (ZEROS / cutoff).ceil() as usize;
        r.table.reserve(PHASES * 2 * r.half);
        for p in 0..PHASES {
            let frac = p as f64 / PHASES as f64;
            for j in 0..2 * r.half {
                r.table.push(kernel(frac + r.half as f64 - 1.0 - j as f64, cutoff, r.half) as f32);
            }
        }
        r
    }

    /// Resample the stream's next block; `last`: it ends with this one (the samples held back
    /// for the filter's reach come out, the input past the end read as silence). In all,
    /// `len × to / from` samples (rounded down).
    pub fn push(&mut self, x: &[f32], last: bool) -> Vec<f32> {
        if self.from == self.to {
            return x.to_vec();
        }
        self.input.extend_from_slice(x);
        self.seen += x.len() as u64;
        let due = if last {
            self.seen * self.to / self.from
        } else {
            // Output samples whose filter reach has all come (`at` may round up a sample).
            self.seen.saturating_sub(self.half as u64 + 1) * self.to / self.from
        };
        let mut out = Vec::with_capacity(due.saturating_sub(self.next) as usize);
        while self.next < due {
            out.push(self.at(self.next));
            self.next += 1;
        }
        // The input no later output sample reads goes.
        let first = ((self.next * self.from / self.to) as usize).saturating_sub(self.half);
        if first > self.base {
            self.input.drain(..(first - self.base).min(self.input.len()));
            self.base = first;
        }
        out
    }

    /// Output sample `i`, the band-limited input at position `i × from / to` (silence outside
    /// the input).
    fn at(&self, i: u64) -> f32 {
        let pos = i * self.from;
        let mut centre = (pos / self.to) as usize;
        let mut p = ((pos % self.to) as f64 / self.to as f64 * PHASES as f64).round() as usize;
        if p == PHASES {
            centre += 1;
            p = 0;
        }
        let taps = &self.table[p * 2 * self.half..(p + 1) * 2 * self.half];
        // Tap j reads input sample `centre + 1 - half + j`.
        let mut acc = 0.0f32;
        for (j, &w) in taps.iter().enumerate() {
            let Some(k) = (centre + 1 + j).checked_sub(self.half) else { continue };
            if let Some(&v) = k.checked_sub(self.base).and_then(|i| self.input.get(i)) {
                acc += v * w;
            }
        }
        acc
    }
}

/// A sinc low-passed to `cutoff` (of the input's Nyquist), Blackman-windowed over `half` input
/// samples each side, at `u` input samples from its centre.
fn kernel(u: f64, cutoff: f64, half: usize) -> f64 {
    let w = u / half as f64;
    if w.abs() >= 1.0 {
        return 0.0;
    }
    let x = std::f64::consts::PI * cutoff * u;
    let sinc = if x.abs() < 1e-12 { 1.0 } else { x.sin() / x };
    let a = std::f64::consts::PI * (w + 1.0);
    cutoff * sinc * (0.42 - 0.5 * a.cos() + 0.08 * (2.0 * a).cos())
}

/// PCM s16le bytes → samples.
pub fn from_s16le(pcm: &[u8]) -> Vec<f32> {
    pcm.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0).collect()
}

/// Samples → PCM s16le bytes.
pub fn to_s16le(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| ((v.clamp(-1.0, 1.0) * 32767.0) as i16).to_le_bytes()).collect()
}

pub fn write_wav(path: &Path, samples: &[f32], rate: u32) -> Result<(), SpeechError> {
    let spec =
        hound::WavSpec { channels: 1, sample_rate: rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let err = |e: hound::Error| SpeechError::Audio(format!("{}: {e}", path.display()));
    let mut w = hound::WavWriter::create(path, spec).map_err(err)?;
    for v in samples {
        w.write_sample((v.clamp(-1.0, 1.0) * 32767.0) as i16).map_err(err)?;
    }
    w.finalize().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sine(hz: f64, rate: u32, seconds: f64) -> Vec<f32> {
        let n = (f64::from(rate) * seconds) as usize;
        (0..n).map(|i| (0.5 * (2.0 * std::f64::consts::PI * hz * i as f64 / f64::from(rate)).sin()) as f32).collect()
    }

    fn rms(x: &[f32]) -> f32 {
        (x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32).sqrt()
    }

    /// A stream in frames of any size comes out as the whole signal would: every sample, in
    /// phase (frames were resampled each on its own: a fraction of a sample lost at each, and
    /// nothing at all from a frame under 3 samples at 48 kHz).
    #[test]
    fn a_stream_in_small_frames_is_the_whole_signal() {
        for (rate, frame) in [
            (44_100, 64),
            (48_000, 2),
            (8_000, 7),
            (384_000, 16),
            (22_050, 441),
            (16_000, 100),
            (9_255, 3),
            (154_764, 333),
        ] {
            let x = sine(440.0, rate, 1.0);
            let whole = resample(&x, rate, 16_000);
            assert_eq!(whole.len(), (x.len() as u64 * 16_000 / u64::from(rate)) as usize);
            let mut r = Resampler::new(rate, 16_000);
            let mut streamed = Vec::new();
            let frames: Vec<&[f32]> = x.chunks(frame).collect();
            for (i, f) in frames.iter().enumerate() {
                streamed.extend(r.push(f, i + 1 == frames.len()));
            }
            assert_eq!(streamed.len(), whole.len(), "{rate} Hz in frames of {frame}");
            let most = streamed.iter().zip(&whole).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(most < 1e-4, "{rate} Hz in frames of {frame}: off by {most}");
            // The tone is kept (its edges aside).
            let n = streamed.len();
            let kept = rms(&streamed[n / 10..n - n / 10]);
            assert!((kept - 0.3536).abs() < 0.01, "{rate} Hz: rms {kept}");
        }
    }

    /// The total is `len × to / from` exactly, at odd rates too (a float step came out one
    /// sample short here).
    #[test]
    fn the_total_is_exact_at_odd_rates() {
        assert_eq!(Resampler::new(9_255, 16_000).push(&vec![0.0; 884_778], true).len(), 1_529_600);
        assert_eq!(resample(&vec![0.0; 9_479_295], 154_764, 16_000).len(), 980_000);
    }

    /// What the lower rate cannot hold is filtered out, not folded into the speech band: a
    /// 12 kHz tone at 48 kHz came out of a plain decimation by 3 as a 4 kHz tone, whole.
    #[test]
    fn tones_above_the_new_nyquist_are_filtered_out() {
        for (rate, hz) in [(48_000, 12_000.0), (44_100, 9_000.0), (384_000, 100_000.0)] {
            let out = resample(&sine(hz, rate, 0.5), rate, 16_000);
            let n = out.len();
            let left = rms(&out[n / 10..n - n / 10]);
            assert!(left < 0.01, "{hz} Hz at {rate}: rms {left} left");
        }
    }

    fn wav(rate: u32, samples: &[f32]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.wav");
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 16_000,
            bits_per_sample: 32,
            sample_format: hound::SampleFormat::Float,
        };
        let mut w = hound::WavWriter::create(&path, spec).unwrap();
        for v in samples {
            w.write_sample(*v).unwrap();
        }
        w.finalize().unwrap();
        // hound writes no rate it finds odd: the header's rate and byte rate, by hand.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[24..28].copy_from_slice(&rate.to_le_bytes());
        bytes[28..32].copy_from_slice(&(rate.wrapping_mul(4)).to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    /// A file no microphone made is refused with its reason, never a panic or a poisoned VAD.
    #[test]
    fn odd_wav_files_are_refused_or_clipped() {
        for rate in [0, 1, 7_999, 384_001] {
            let (_d, p) = wav(rate, &[0.0; 16]);
            let e = read_wav(&p).unwrap_err().to_string();
            assert!(e.contains("sample rate"), "{rate}: {e}");
        }
        for bad in [f32::NAN, f32::INFINITY] {
            let (_d, p) = wav(16_000, &[0.0, bad, 0.0]);
            assert!(read_wav(&p).unwrap_err().to_string().contains("sample 1"));
        }
        let (_d, p) = wav(16_000, &[3.0, -2.0, 0.5]);
        assert_eq!(read_wav(&p).unwrap(), [1.0, -1.0, 0.5]);
    }

    /// An extensible header's valid bits past 32 (hound takes any number but 0) are refused by
    /// name: the scale's shift overflowed (a panic in a debug build).
    #[test]
    fn integer_samples_wider_than_32_bits_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.wav");
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 16_000,
            bits_per_sample: 24,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::create(&path, spec).unwrap();
        for v in [0, 1000, -1000] {
            w.write_sample(v).unwrap();
        }
        w.finalize().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes[20..22], 0xFFFEu16.to_le_bytes(), "hound wrote no extensible header");
        assert_eq!(read_wav(&path).unwrap().len(), 3);
        for valid in [33u16, 65_535] {
            bytes[38..40].copy_from_slice(&valid.to_le_bytes());
            std::fs::write(&path, &bytes).unwrap();
            let e = read_wav(&path).unwrap_err().to_string();
            assert!(e.contains(&format!("{valid}-bit samples")), "{valid}: {e}");
        }
    }
}
