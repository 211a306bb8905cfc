// Why: a clip of s16le PCM with its format, and the two conversions a client needs before
// sending (down-mix to mono, linear resampling, e.g. to 16 kHz).
package org.kazeia.client;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/** {@code data}: interleaved signed 16-bit little-endian samples, read-only. */
public record Pcm(int sampleRate, int channels, ByteBuffer data) {
    public Pcm {
        if (sampleRate <= 0 || channels < 1) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "PCM needs a positive rate and at least one channel");
        }
        if (data.remaining() % (2 * channels) != 0) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "PCM length is not a whole number of s16 frames");
        }
        data = data.slice().asReadOnlyBuffer().order(ByteOrder.LITTLE_ENDIAN);
    }

    public static Pcm of(byte[] s16le, int sampleRate, int channels) {
        return new Pcm(sampleRate, channels, ByteBuffer.wrap(s16le));
    }

    public static Pcm of(short[] samples, int sampleRate, int channels) {
        ByteBuffer b = ByteBuffer.allocate(samples.length * 2).order(ByteOrder.LITTLE_ENDIAN);
        b.asShortBuffer().put(samples);
        return new Pcm(sampleRate, channels, b);
    }

    public short[] samples() {
        short[] out = new short[data.remaining() / 2];
        data.duplicate().order(ByteOrder.LITTLE_ENDIAN).asShortBuffer().get(out);
        return out;
    }

    /** Samples per channel. */
    public int frames() {
        return data.remaining() / (2 * channels);
    }

    public double seconds() {
        return frames() / (double) sampleRate;
    }

    /** Channels averaged into one. */
    public Pcm toMono() {
        if (channels == 1) {
            return this;
        }
        short[] s = samples();
        short[] out = new short[frames()];
        for (int f = 0; f < out.length; f++) {
            int sum = 0;
            for (int c = 0; c < channels; c++) {
                sum += s[f * channels + c];
            }
            out[f] = (short) (sum / channels);
        }
        return of(out, sampleRate, 1);
    }

    /** Linear interpolation to {@code rate} (no low-pass: fine for speech to 16 kHz). */
    public Pcm resample(int rate) {
        if (rate == sampleRate) {
            return this;
        }
        short[] s = samples();
        int inFrames = frames();
        int outFrames = (int) ((long) inFrames * rate / sampleRate);
        short[] out = new short[outFrames * channels];
        double step = sampleRate / (double) rate;
        for (int f = 0; f < outFrames; f++) {
            double pos = f * step;
            int i0 = (int) pos;
            int i1 = Math.min(i0 + 1, inFrames - 1);
            double t = pos - i0;
            for (int c = 0; c < channels; c++) {
                double v = s[i0 * channels + c] * (1 - t) + s[i1 * channels + c] * t;
                out[f * channels + c] = (short) Math.round(v);
            }
        }
        return of(out, rate, channels);
    }

    /** What the daemon's speech models take: 16 kHz mono. */
    public Pcm toMono16k() {
        return toMono().resample(16_000);
    }
}
