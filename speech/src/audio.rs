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

/// Interleaved samples at `rate` with `channels` → 16 kHz mono (channel mean, linear
/// interpolation; speech has nothing above 8 kHz worth keeping for Whisper).
pub fn to_16k_mono(interleaved: &[f32], rate: u32, channels: u16) -> Vec<f32> {
    let ch = channels.max(1) as usize;
    let mono: Vec<f32> = interleaved.chunks_exact(ch).map(|f| f.iter().sum::<f32>() / ch as f32).collect();
    resample(&mono, rate, 16_000)
}

pub fn resample(x: &[f32], from: u32, to: u32) -> Vec<f32> {
    if from == to || x.is_empty() {
        return x.to_vec();
    }
    let n = (x.len() as u64 * u64::from(to) / u64::from(from)) as usize;
    let step = f64::from(from) / f64::from(to);
    (0..n)
        .map(|i| {
            let t = i as f64 * step;
            let j = t as usize;
            let f = (t - j as f64) as f32;
            let a = x[j.min(x.len() - 1)];
            let b = x[(j + 1).min(x.len() - 1)];
            a + (b - a) * f
        })
        .collect()
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
}
